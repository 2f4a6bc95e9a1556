//! Epsilon-greedy exploration schedules, driven by collected env steps (DI-engine's
//! `get_epsilon_greedy_fn`).

use drill_config::{EpsConfig, EpsKind};

/// Epsilon at env step `t`: `exp`: `end + (start - end) * exp(-t / decay)`;
/// `linear`: from `start` to `end` over `decay` steps, then `end`.
pub(crate) fn epsilon(cfg: &EpsConfig, t: u64) -> f64 {
    let t = t as f64;
    match cfg.kind {
        EpsKind::Exp => cfg.end + (cfg.start - cfg.end) * (-t / cfg.decay).exp(),
        EpsKind::Linear => {
            if t >= cfg.decay {
                cfg.end
            } else {
                cfg.start + (cfg.end - cfg.start) * t / cfg.decay
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_and_linear_schedules() {
        let cfg = EpsConfig {
            kind: EpsKind::Exp,
            start: 0.95,
            end: 0.1,
            decay: 10000.0,
        };
        assert_eq!(epsilon(&cfg, 0), 0.95);
        // 0.1 + 0.85 * e^-1
        assert!((epsilon(&cfg, 10000) - 0.412_697_525).abs() < 1e-6);
        assert!((epsilon(&cfg, 1_000_000) - 0.1).abs() < 1e-12);
        let lin = EpsConfig {
            kind: EpsKind::Linear,
            start: 1.0,
            end: 0.05,
            decay: 100.0,
        };
        assert!((epsilon(&lin, 50) - 0.525).abs() < 1e-12);
        assert_eq!(epsilon(&lin, 100), 0.05);
        assert_eq!(epsilon(&lin, 5000), 0.05);
    }
}
