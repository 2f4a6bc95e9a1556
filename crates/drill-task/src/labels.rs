//! [`Labels`]: what a process is (`standalone`, `distributed`, `async`, `node.N`, user labels)
//! and glob matching over them.

use std::collections::BTreeSet;

/// A set of labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(BTreeSet<String>);

impl Labels {
    /// Labels from names.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Self(names.into_iter().map(Into::into).collect())
    }

    /// Add comma-separated labels from `DRILL_LABELS` (or any string).
    pub fn extend_from_list(&mut self, list: &str) {
        self.0.extend(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
    }

    /// Add one label.
    pub fn insert(&mut self, label: impl Into<String>) {
        self.0.insert(label.into());
    }

    /// Whether `label` is present exactly.
    pub fn contains(&self, label: &str) -> bool {
        self.0.contains(label)
    }

    /// True when every pattern (glob: `*`, `?`, `[..]`) matches at least one label, as
    /// DI-engine's `task.match_labels`. A malformed pattern is an error naming it.
    pub fn matches<S: AsRef<str>>(&self, patterns: &[S]) -> Result<bool, String> {
        for p in patterns {
            let pat = glob::Pattern::new(p.as_ref())
                .map_err(|e| format!("label pattern {:?}: {e}", p.as_ref()))?;
            if !self.0.iter().any(|l| pat.matches(l)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The labels, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_di_engine() {
        let mut l = Labels::new(["distributed", "node.3"]);
        l.extend_from_list("collector, gpu-a100,");
        assert!(l.matches(&["node.*"]).unwrap());
        assert!(l.matches(&["node.?", "collector"]).unwrap());
        assert!(l.matches(&["node.[0-3]"]).unwrap());
        assert!(!l.matches(&["node.[4-9]"]).unwrap());
        assert!(
            !l.matches(&["node.3", "learner"]).unwrap(),
            "every pattern must match"
        );
        assert!(l.matches::<&str>(&[]).unwrap());
        assert!(l.contains("gpu-a100"));
        let e = l.matches(&["node.[0-"]).unwrap_err();
        assert!(e.contains("node.[0-"), "{e}");
    }
}
