//! Where ROMs come from. drill ships none: it looks in `ALE_ROM_DIR`, then `DRILL_ROM_DIR`,
//! then the `ale_py/roms` folder of a pip-installed `ale-py` (the wheel carries them), and
//! otherwise fails saying how to get them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How to get ROMs, for error messages and the README.
pub const HOW_TO_GET_ROMS: &str = "install them with `pip install ale-py` (drill finds its ale_py/roms), or unzip the wheel from `pip download ale-py==0.12.1 --no-deps` and set ALE_ROM_DIR=<unzipped>/ale_py/roms";

/// The ROM file of `game` (ALE's name, e.g. `space_invaders`): the folders searched, in order,
/// and the file if one of them has it.
pub fn find(game: &str) -> (Vec<PathBuf>, Option<PathBuf>) {
    let file = format!("{game}.bin");
    let mut searched = Vec::new();
    for var in ["ALE_ROM_DIR", "DRILL_ROM_DIR"] {
        if let Some(dir) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let dir = PathBuf::from(dir);
            let f = dir.join(&file);
            searched.push(dir);
            if f.is_file() {
                return (searched, Some(f));
            }
        }
    }
    for dir in pip_rom_dirs() {
        let f = dir.join(&file);
        searched.push(dir);
        if f.is_file() {
            return (searched, Some(f));
        }
    }
    (searched, None)
}

/// `ale_py/roms` in the site-packages of the Python on PATH (and of an active virtualenv),
/// asked of Python once per process.
fn pip_rom_dirs() -> Vec<PathBuf> {
    static DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let mut dirs = Vec::new();
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
            site_packages_under(Path::new(&venv), &mut dirs);
        }
        let script = "import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))";
        for python in ["python3", "python"] {
            if let Ok(out) = Command::new(python).args(["-c", script]).output()
                && out.status.success()
            {
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    let d = Path::new(line.trim()).join("ale_py").join("roms");
                    if !dirs.contains(&d) {
                        dirs.push(d);
                    }
                }
                break;
            }
        }
        dirs
    })
    .clone()
}

fn site_packages_under(venv: &Path, dirs: &mut Vec<PathBuf>) {
    let Ok(libs) = std::fs::read_dir(venv.join("lib")) else {
        return;
    };
    for lib in libs.flatten() {
        let d = lib.path().join("site-packages").join("ale_py").join("roms");
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
}
