//! Crash states of a recorded run, the way ALICE and CrashMonkey find them: the file
//! operations a process made (recorded with `strace`) are replayed on a model of a file
//! system with a write-back cache, and after every prefix of them the model says what a
//! power cut at that point could leave on disk.
//!
//! The model: a file's contents reach the disk at its `fsync`/`fdatasync` (what it held
//! then); a name (a new file, folder, rename or unlink) reaches the disk when its folder
//! is `fsync`ed. Two states are read at every crash point:
//! - **synced only**: the names and contents the syncs so far made durable, nothing else
//!   (everything in the write-back cache lost);
//! - **names ahead of data**: every name operation so far on disk, in order, but file
//!   contents only as last synced, truncations included (a rename or truncation written
//!   before the data it was meant to follow: ext4's zero-length files, and any file system
//!   that orders metadata and data independently).
//!
//! One process is modelled (its threads share one table of file descriptors); the recorder
//! refuses a trace with a fork, and checks that its replay ends with exactly the files the
//! run left on disk, so a write it did not see cannot go unnoticed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The system calls recorded: every one that creates, names, writes, syncs or removes a
/// file, and the clones that decide whether file descriptors are shared.
const SYSCALLS: &str = "trace=openat,open,creat,write,pwrite64,writev,pwritev,pwritev2,lseek,\
    ftruncate,truncate,fsync,fdatasync,sync,syncfs,rename,renameat,renameat2,mkdir,mkdirat,\
    unlink,unlinkat,rmdir,close,dup,dup2,dup3,fcntl,link,linkat,symlink,symlinkat,fallocate,\
    copy_file_range,sendfile,splice,clone,clone3,fork,vfork";

/// One file operation under the recorded root, paths relative to it ("" is the root).
#[derive(Clone, Debug)]
pub enum Op {
    Open {
        fd: i64,
        path: String,
        create: bool,
        trunc: bool,
        append: bool,
    },
    /// An fd that refers to something outside the root (its writes are not modelled).
    OpenOutside {
        fd: i64,
    },
    Write {
        fd: i64,
        at: Option<u64>,
        data: Vec<u8>,
    },
    Seek {
        fd: i64,
        to: u64,
    },
    Truncate {
        fd: i64,
        len: u64,
    },
    Sync {
        fd: i64,
    },
    Mkdir(String),
    Rename {
        from: String,
        to: String,
    },
    Unlink(String),
    Rmdir(String),
    Close {
        fd: i64,
    },
    Dup {
        old: i64,
        new: i64,
    },
    /// The process ended (between two recorded commands): its fds are gone.
    Exit,
}

/// Run `cmd` (working directory: `root`) under `strace` and return its file operations
/// under `root`, in the order they completed.
pub fn record(cmd: &mut Command, root: &Path) -> Result<Vec<Op>, String> {
    let root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let trace = root.with_extension("strace");
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let envs: Vec<_> = cmd
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    let mut strace = Command::new("strace");
    strace
        .args(["-f", "-qq", "-xx", "-s", "1000000000", "-e", SYSCALLS, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(program)
        .args(args)
        .current_dir(&root);
    for (k, v) in envs {
        match v {
            Some(v) => strace.env(k, v),
            None => strace.env_remove(k),
        };
    }
    let out = strace
        .output()
        .map_err(|e| format!("cannot run strace (apt install strace): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the recorded command failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(&trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let _ = std::fs::remove_file(&trace);
    parse(&text, &root)
}

/// The operations of an `strace -f -xx` log, paths made relative to `root`.
fn parse(text: &str, root: &Path) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    let mut unfinished: HashMap<String, String> = HashMap::new();
    // Directory fds opened under the root (for the *at calls), by fd.
    let mut dirs: HashMap<i64, PathBuf> = HashMap::new();
    for raw in text.lines() {
        let (pid, rest) = raw.trim_start().split_once(' ').ok_or(raw)?;
        let rest = rest.trim_start();
        if rest.starts_with("---") || rest.starts_with("+++") {
            continue;
        }
        let line = if let Some(head) = rest.strip_suffix("<unfinished ...>") {
            unfinished.insert(pid.to_string(), head.trim_end().to_string());
            continue;
        } else if rest.starts_with("<...") {
            let head = unfinished
                .remove(pid)
                .ok_or_else(|| format!("resumed without a start: {raw}"))?;
            let tail = rest.split_once("resumed>").ok_or(raw)?.1;
            format!("{head}{tail}")
        } else {
            rest.to_string()
        };
        let Some(call) = Call::parse(&line) else {
            return Err(format!("unparsed strace line: {line}"));
        };
        if call.ret < 0 {
            continue;
        }
        let path = |i: usize, dirfd: Option<usize>| -> Result<Option<String>, String> {
            let p = PathBuf::from(String::from_utf8_lossy(&call.string(i)?).into_owned());
            let base = match dirfd.map(|d| call.args[d].as_str()) {
                None | Some("AT_FDCWD") => root.to_path_buf(),
                Some(fd) => match dirs.get(&fd.parse::<i64>().map_err(|e| e.to_string())?) {
                    Some(d) => d.clone(),
                    None => return Ok(None),
                },
            };
            Ok(relative(&base.join(p), root))
        };
        let fd = |i: usize| call.int(i);
        match call.name.as_str() {
            "open" | "openat" | "creat" => {
                let (p, flags) = match call.name.as_str() {
                    "openat" => (path(1, Some(0))?, call.args[2].clone()),
                    "open" => (path(0, None)?, call.args[1].clone()),
                    _ => (path(0, None)?, "O_CREAT|O_WRONLY|O_TRUNC".into()),
                };
                let new = call.ret;
                dirs.remove(&new);
                match p {
                    Some(p) => {
                        dirs.insert(new, root.join(&p));
                        ops.push(Op::Open {
                            fd: new,
                            path: p,
                            create: flags.contains("O_CREAT"),
                            trunc: flags.contains("O_TRUNC"),
                            append: flags.contains("O_APPEND"),
                        })
                    }
                    None => ops.push(Op::OpenOutside { fd: new }),
                }
            }
            "write" => ops.push(Op::Write {
                fd: fd(0)?,
                at: None,
                data: call.string(1)?[..call.ret as usize].to_vec(),
            }),
            "pwrite64" => ops.push(Op::Write {
                fd: fd(0)?,
                at: Some(call.int(3)? as u64),
                data: call.string(1)?[..call.ret as usize].to_vec(),
            }),
            "writev" => {
                let mut data = call.all_strings(1)?;
                data.truncate(call.ret as usize);
                ops.push(Op::Write {
                    fd: fd(0)?,
                    at: None,
                    data,
                })
            }
            "lseek" => ops.push(Op::Seek {
                fd: fd(0)?,
                to: call.ret as u64,
            }),
            "ftruncate" => ops.push(Op::Truncate {
                fd: fd(0)?,
                len: call.int(1)? as u64,
            }),
            "fsync" | "fdatasync" => ops.push(Op::Sync { fd: fd(0)? }),
            "mkdir" => push_some(&mut ops, path(0, None)?.map(Op::Mkdir)),
            "mkdirat" => push_some(&mut ops, path(1, Some(0))?.map(Op::Mkdir)),
            "rename" | "renameat" | "renameat2" => {
                let (from, to) = if call.name == "rename" {
                    (path(0, None)?, path(1, None)?)
                } else {
                    (path(1, Some(0))?, path(3, Some(2))?)
                };
                match (from, to) {
                    (Some(from), Some(to)) => ops.push(Op::Rename { from, to }),
                    (None, None) => {}
                    _ => return Err(format!("a rename across the root's edge: {line}")),
                }
            }
            "unlink" => push_some(&mut ops, path(0, None)?.map(Op::Unlink)),
            "rmdir" => push_some(&mut ops, path(0, None)?.map(Op::Rmdir)),
            "unlinkat" => {
                let p = path(1, Some(0))?;
                if call.args[2].contains("AT_REMOVEDIR") {
                    push_some(&mut ops, p.map(Op::Rmdir))
                } else {
                    push_some(&mut ops, p.map(Op::Unlink))
                }
            }
            "close" => {
                dirs.remove(&fd(0)?);
                ops.push(Op::Close { fd: fd(0)? })
            }
            "dup" | "dup2" | "dup3" => ops.push(Op::Dup {
                old: fd(0)?,
                new: call.ret,
            }),
            "fcntl" if call.args[1].starts_with("F_DUPFD") => ops.push(Op::Dup {
                old: fd(0)?,
                new: call.ret,
            }),
            "fcntl" => {}
            "clone" | "clone3" | "fork" | "vfork" => {
                if !call.args.join(",").contains("CLONE_THREAD") {
                    return Err(format!(
                        "the recorder models one process; it forked: {line}"
                    ));
                }
            }
            "sync" | "syncfs" | "truncate" | "link" | "linkat" | "symlink" | "symlinkat"
            | "fallocate" | "copy_file_range" | "sendfile" | "splice" | "pwritev" | "pwritev2" => {
                return Err(format!("a file operation the model does not know: {line}"));
            }
            other => return Err(format!("unexpected system call {other}: {line}")),
        }
    }
    Ok(ops)
}

fn push_some(ops: &mut Vec<Op>, op: Option<Op>) {
    ops.extend(op);
}

/// `path` relative to `root` ("" for the root), `None` outside it.
fn relative(path: &Path, root: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            std::path::Component::RootDir => parts.clear(),
            other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
        }
    }
    let full = format!("/{}", parts.join("/"));
    let root = root.to_string_lossy();
    if full == root {
        Some(String::new())
    } else {
        full.strip_prefix(&format!("{root}/")).map(str::to_string)
    }
}

/// One completed system call from a line of `strace -xx`: name, raw arguments, result.
struct Call {
    name: String,
    args: Vec<String>,
    ret: i64,
}

impl Call {
    fn parse(line: &str) -> Option<Call> {
        let open = line.find('(')?;
        let name = line[..open].trim().to_string();
        // strace pads the result to a column: "close(3)      = 0".
        let eq = line.rfind(" = ")?;
        let close = line[..eq].trim_end().strip_suffix(')')?.len();
        let ret_text = line[eq + 3..].trim();
        let ret = ret_text.split_whitespace().next()?;
        let ret = if let Some(hex) = ret.strip_prefix("0x") {
            i64::from_str_radix(hex, 16).ok()?
        } else {
            ret.parse().ok()?
        };
        Some(Call {
            name,
            args: split_args(&line[open + 1..close]),
            ret,
        })
    }

    fn int(&self, i: usize) -> Result<i64, String> {
        let a = self.args.get(i).ok_or("missing argument")?;
        a.trim()
            .parse()
            .map_err(|e| format!("argument {i} of {} ({a}): {e}", self.name))
    }

    /// Argument `i`, a string strace wrote with `-xx`.
    fn string(&self, i: usize) -> Result<Vec<u8>, String> {
        let a = self.args.get(i).ok_or("missing argument")?;
        let quoted = a.trim();
        let inner = quoted
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .ok_or_else(|| format!("not a whole string (truncated?): {}", &a[..a.len().min(80)]))?;
        unhex(inner)
    }

    /// The strings of argument `i` (a writev's buffers), joined.
    fn all_strings(&self, i: usize) -> Result<Vec<u8>, String> {
        let a = self.args.get(i).ok_or("missing argument")?;
        let mut out = Vec::new();
        for (k, part) in a.split('"').enumerate() {
            if k % 2 == 1 {
                out.extend(unhex(part)?);
            }
        }
        Ok(out)
    }
}

/// Split at the commas outside strings, brackets and braces.
fn split_args(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth, mut quoted) = (Vec::new(), String::new(), 0i32, false);
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            '[' | '{' if !quoted => depth += 1,
            ']' | '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 4);
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1] == b'x' {
            let h = std::str::from_utf8(&b[i + 2..i + 4]).map_err(|e| e.to_string())?;
            out.push(u8::from_str_radix(h, 16).map_err(|e| e.to_string())?);
            i += 4;
        } else {
            return Err(format!(
                "not an -xx string at byte {i}: {}",
                &s[i..s.len().min(i + 20)]
            ));
        }
    }
    Ok(out)
}

/// A file system with a write-back cache (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Node {
    Dir,
    File(usize),
}

#[derive(Default)]
struct Inode {
    data: Vec<u8>,
    synced: Vec<u8>,
    /// The shortest length a truncation gave it since its last sync.
    cut: Option<usize>,
}

/// What an fd refers to.
#[derive(Clone)]
enum Handle {
    Outside,
    Dir(String),
    File {
        inode: usize,
        pos: u64,
        append: bool,
    },
}

/// What made a folder's entries differ from the disk's since its last sync.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Dirty {
    /// A rename into it or out of it (an atomic replacement waiting for its sync).
    pub renamed: bool,
    /// A name added or removed: a new folder or file, an unlink.
    pub created: bool,
}

/// The model's state after a prefix of the operations.
#[derive(Default)]
pub struct Fs {
    inodes: Vec<Inode>,
    live: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
    fds: HashMap<i64, Handle>,
    dirty: HashMap<String, Dirty>,
}

/// What a crash leaves: each path and its contents (`None` for a folder).
pub type Disk<'a> = BTreeMap<&'a str, Option<&'a [u8]>>;

/// Which crash state to read (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Crash {
    SyncedOnly,
    NamesAheadOfData,
}

fn parent(path: &str) -> String {
    path.rsplit_once('/')
        .map(|(p, _)| p.to_string())
        .unwrap_or_default()
}

impl Fs {
    pub fn new() -> Fs {
        let mut fs = Fs::default();
        fs.live.insert(String::new(), Node::Dir);
        fs.durable.insert(String::new(), Node::Dir);
        fs
    }

    /// What `fd` refers to: `Some(true)` a folder, `Some(false)` a file under the root.
    pub fn fd_is_dir(&self, fd: i64) -> Option<bool> {
        match self.fds.get(&fd)? {
            Handle::Dir(_) => Some(true),
            Handle::File { .. } => Some(false),
            Handle::Outside => None,
        }
    }

    /// The path `fd`'s file has now (`None`: a folder, outside, or unlinked).
    pub fn fd_path(&self, fd: i64) -> Option<&str> {
        let Some(Handle::File { inode, .. }) = self.fds.get(&fd) else {
            return None;
        };
        self.live
            .iter()
            .find(|(_, n)| **n == Node::File(*inode))
            .map(|(p, _)| p.as_str())
    }

    /// The folder `fd` refers to and what changed in it since its last sync.
    pub fn dir_of(&self, fd: i64) -> Option<(&str, Dirty)> {
        match self.fds.get(&fd)? {
            Handle::Dir(d) => Some((d, self.dirty.get(d).copied().unwrap_or_default())),
            _ => None,
        }
    }

    /// Whether `path` is a folder now.
    pub fn is_dir(&self, path: &str) -> bool {
        self.live.get(path) == Some(&Node::Dir)
    }

    /// The live contents of the file at `path`.
    pub fn read(&self, path: &str) -> Option<&[u8]> {
        match self.live.get(path)? {
            Node::File(i) => Some(&self.inodes[*i].data),
            Node::Dir => None,
        }
    }

    fn touch(&mut self, dir: &str, f: impl FnOnce(&mut Dirty)) {
        f(self.dirty.entry(dir.to_string()).or_default());
    }

    fn file(&mut self, fd: i64) -> Option<(&mut Inode, &mut u64, bool)> {
        match self.fds.get_mut(&fd)? {
            Handle::File { inode, pos, append } => Some((&mut self.inodes[*inode], pos, *append)),
            _ => None,
        }
    }

    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Open {
                fd,
                path,
                create,
                trunc,
                append,
            } => {
                let node = match self.live.get(path) {
                    Some(n) => *n,
                    None if *create => {
                        self.require_dir(&parent(path))?;
                        self.inodes.push(Inode::default());
                        let n = Node::File(self.inodes.len() - 1);
                        self.live.insert(path.clone(), n);
                        self.touch(&parent(path), |d| d.created = true);
                        n
                    }
                    None => return Err(format!("open of {path}, which the model does not hold")),
                };
                let handle = match node {
                    Node::Dir => Handle::Dir(path.clone()),
                    Node::File(i) => {
                        if *trunc {
                            let ino = &mut self.inodes[i];
                            ino.data.clear();
                            ino.cut = Some(0);
                        }
                        Handle::File {
                            inode: i,
                            pos: 0,
                            append: *append,
                        }
                    }
                };
                self.fds.insert(*fd, handle);
            }
            Op::OpenOutside { fd } => {
                self.fds.insert(*fd, Handle::Outside);
            }
            Op::Write { fd, at, data } => {
                if let Some((ino, pos, append)) = self.file(*fd) {
                    let start = match at {
                        Some(a) => *a as usize,
                        None if append => ino.data.len(),
                        None => *pos as usize,
                    };
                    if ino.data.len() < start {
                        ino.data.resize(start, 0);
                    }
                    let end = start + data.len();
                    if ino.data.len() < end {
                        ino.data.resize(end, 0);
                    }
                    ino.data[start..end].copy_from_slice(data);
                    if at.is_none() {
                        *pos = end as u64;
                    }
                }
            }
            Op::Seek { fd, to } => {
                if let Some((_, pos, _)) = self.file(*fd) {
                    *pos = *to;
                }
            }
            Op::Truncate { fd, len } => {
                if let Some((ino, _, _)) = self.file(*fd) {
                    let len = *len as usize;
                    if len < ino.data.len() {
                        ino.cut = Some(ino.cut.map_or(len, |c| c.min(len)));
                    }
                    ino.data.resize(len, 0);
                }
            }
            Op::Sync { fd } => match self.fds.get(fd).cloned() {
                Some(Handle::File { inode, .. }) => {
                    let ino = &mut self.inodes[inode];
                    ino.synced = ino.data.clone();
                    ino.cut = None;
                }
                Some(Handle::Dir(dir)) => {
                    let children: Vec<String> = self
                        .live
                        .keys()
                        .chain(self.durable.keys())
                        .filter(|p| !p.is_empty() && parent(p) == dir)
                        .cloned()
                        .collect();
                    for child in children {
                        match self.live.get(&child) {
                            Some(n) => self.durable.insert(child, *n),
                            None => self.durable.remove(&child),
                        };
                    }
                    self.dirty.remove(&dir);
                }
                Some(Handle::Outside) | None => {}
            },
            Op::Mkdir(path) => {
                self.require_dir(&parent(path))?;
                if self.live.contains_key(path) {
                    return Err(format!("mkdir of {path}, which exists"));
                }
                self.live.insert(path.clone(), Node::Dir);
                self.touch(&parent(path), |d| d.created = true);
            }
            Op::Rename { from, to } => {
                let node = self
                    .live
                    .remove(from)
                    .ok_or_else(|| format!("rename of {from}, which the model does not hold"))?;
                if node == Node::Dir {
                    return Err(format!("rename of the folder {from}: not modelled"));
                }
                self.require_dir(&parent(to))?;
                self.live.insert(to.clone(), node);
                self.touch(&parent(from), |d| d.renamed = true);
                self.touch(&parent(to), |d| d.renamed = true);
            }
            Op::Unlink(path) => {
                self.live
                    .remove(path)
                    .ok_or_else(|| format!("unlink of {path}, which the model does not hold"))?;
                self.touch(&parent(path), |d| d.created = true);
            }
            Op::Rmdir(path) => {
                if self
                    .live
                    .keys()
                    .any(|p| !p.is_empty() && parent(p) == *path)
                {
                    return Err(format!("rmdir of {path}, which is not empty"));
                }
                self.live.remove(path);
                self.touch(&parent(path), |d| d.created = true);
            }
            Op::Close { fd } => {
                self.fds.remove(fd);
            }
            Op::Exit => self.fds.clear(),
            Op::Dup { old, new } => {
                if let Some(h) = self.fds.get(old).cloned() {
                    self.fds.insert(*new, h);
                } else {
                    self.fds.remove(new);
                }
            }
        }
        Ok(())
    }

    fn require_dir(&self, dir: &str) -> Result<(), String> {
        match self.live.get(dir) {
            Some(Node::Dir) => Ok(()),
            _ => Err(format!("{dir:?} is not a folder in the model")),
        }
    }

    /// What a crash now would leave (see the module docs): the paths reachable from the
    /// root, with their contents.
    pub fn crash(&self, kind: Crash) -> Disk<'_> {
        let names = match kind {
            Crash::SyncedOnly => &self.durable,
            Crash::NamesAheadOfData => &self.live,
        };
        let mut disk = Disk::new();
        for (path, node) in names {
            // Reachable: every folder above it is on disk too.
            let mut up = parent(path);
            let reachable = path.is_empty()
                || loop {
                    if names.get(&up) != Some(&Node::Dir) {
                        break false;
                    }
                    if up.is_empty() {
                        break true;
                    }
                    up = parent(&up);
                };
            if !reachable {
                continue;
            }
            let contents = match node {
                Node::Dir => None,
                Node::File(i) => {
                    let ino = &self.inodes[*i];
                    Some(match (kind, ino.cut) {
                        (Crash::NamesAheadOfData, Some(c)) => {
                            &ino.synced[..c.min(ino.synced.len())]
                        }
                        _ => &ino.synced[..],
                    })
                }
            };
            disk.insert(path.as_str(), contents);
        }
        disk
    }

    /// The files as the running process saw them (no crash): path and contents.
    pub fn live_files(&self) -> BTreeMap<&str, &[u8]> {
        self.live
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(i) => Some((p.as_str(), &self.inodes[*i].data[..])),
                Node::Dir => None,
            })
            .collect()
    }
}

/// Write `disk` under `dir` (a fresh folder): the crash state as files a run can resume from.
pub fn materialize(disk: &Disk<'_>, dir: &Path) -> std::io::Result<()> {
    for (path, contents) in disk {
        let at = dir.join(path);
        match contents {
            None => std::fs::create_dir_all(&at)?,
            Some(bytes) => std::fs::write(&at, bytes)?,
        }
    }
    Ok(())
}
