//! Queue selection for backup: which discovered queues `source.queues` selects (SPEC.md
//! "source.queues").
//!
//! Rules, applied in this order; the first that fails skips the queue:
//! 1. `include`: the name matches at least one glob (an empty list includes every name);
//! 2. `exclude`: the name matches no glob;
//! 3. `vhosts`: the vhost is in the list (exact, case-sensitive; empty = every vhost);
//! 4. `types`: the queue type is in the list (empty = every type);
//! 5. `min_messages`: the queue holds at least `min_messages` messages.
//!
//! Globs: `*` matches any run of characters (including none, and including `/`, `.` and
//! spaces), `?` exactly one character (a Unicode scalar value, not a byte); every other character
//! matches itself, case-sensitively. There is no escape character. A whole name must match.

use wildmatch::WildMatch;

use crate::broker::QueueType;
use crate::config::QueueSelection;

/// True when `pattern` (glob: `*`, `?`) matches the whole of `name`, case-sensitively.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    WildMatch::new(pattern).matches(name)
}

impl QueueSelection {
    /// True when the queue `name` in `vhost`, of type `queue_type`, holding `messages` messages,
    /// is selected (see the module doc for the rules).
    pub fn matches(&self, vhost: &str, name: &str, queue_type: QueueType, messages: u64) -> bool {
        self.explain(vhost, name, queue_type, messages).is_none()
    }

    /// Why the queue is skipped, for debug logs, or `None` when it is selected. The reason names
    /// the first rule (module doc order) that rejects it.
    pub fn explain(
        &self,
        vhost: &str,
        name: &str,
        queue_type: QueueType,
        messages: u64,
    ) -> Option<String> {
        if !self.include.is_empty() && !self.include.iter().any(|p| glob_matches(p, name)) {
            return Some(format!(
                "queue {name:?} in vhost {vhost:?} matches no source.queues.include pattern"
            ));
        }
        if let Some(p) = self.exclude.iter().find(|p| glob_matches(p, name)) {
            return Some(format!(
                "queue {name:?} in vhost {vhost:?} matches source.queues.exclude pattern {p:?}"
            ));
        }
        if !self.vhosts.is_empty() && !self.vhosts.iter().any(|v| v == vhost) {
            return Some(format!(
                "queue {name:?}: vhost {vhost:?} is not in source.queues.vhosts"
            ));
        }
        if !self.types.is_empty() && !self.types.contains(&queue_type) {
            return Some(format!(
                "queue {name:?} in vhost {vhost:?}: type {queue_type} is not in source.queues.types"
            ));
        }
        if messages < self.min_messages {
            return Some(format!(
                "queue {name:?} in vhost {vhost:?} holds {messages} messages, fewer than source.queues.min_messages ({})",
                self.min_messages
            ));
        }
        None
    }
}

/// True when a queue of a type rmq-backup does not know (a plugin's) is selected by `sel`: by
/// name, vhost and depth, and only when `sel` has no `types` filter (which can only name known
/// types). `None` (source.queues omitted) selects every queue.
pub fn selected_any_type(
    sel: Option<&QueueSelection>,
    vhost: &str,
    name: &str,
    messages: u64,
) -> bool {
    sel.is_none_or(|s| s.types.is_empty() && s.matches(vhost, name, QueueType::Classic, messages))
}

/// True when the queue is selected by `sel`; `None` (source.queues omitted) selects every queue.
pub fn selected(
    sel: Option<&QueueSelection>,
    vhost: &str,
    name: &str,
    queue_type: QueueType,
    messages: u64,
) -> bool {
    sel.is_none_or(|s| s.matches(vhost, name, queue_type, messages))
}

/// Why the queue is skipped, or `None` when selected; `None` selection selects every queue.
pub fn skip_reason(
    sel: Option<&QueueSelection>,
    vhost: &str,
    name: &str,
    queue_type: QueueType,
    messages: u64,
) -> Option<String> {
    sel.and_then(|s| s.explain(vhost, name, queue_type, messages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use QueueType::{Classic, Quorum, Stream};

    fn inc(patterns: &[&str]) -> QueueSelection {
        QueueSelection {
            include: patterns.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn name_ok(sel: &QueueSelection, name: &str) -> bool {
        sel.matches("/", name, Classic, 0)
    }

    #[test]
    fn none_selection_selects_everything() {
        assert!(selected(None, "/", "anything", Stream, 0));
        assert!(selected(None, "v", "", Quorum, u64::MAX));
        assert_eq!(skip_reason(None, "/", "q", Classic, 0), None);
    }

    #[test]
    fn default_selection_selects_everything() {
        let sel = QueueSelection::default();
        for (v, n, t, m) in [
            ("/", "q", Classic, 0),
            ("x", "", Stream, 5),
            ("é", "a b", Quorum, 1),
        ] {
            assert!(sel.matches(v, n, t, m), "{v} {n}");
            assert!(selected(Some(&sel), v, n, t, m));
        }
    }

    #[test]
    fn literal_patterns_match_whole_name_only() {
        let sel = inc(&["orders"]);
        assert!(name_ok(&sel, "orders"));
        assert!(!name_ok(&sel, "orders2"));
        assert!(!name_ok(&sel, "my-orders"));
        assert!(!name_ok(&sel, "order"));
        assert!(!name_ok(&sel, ""));
    }

    #[test]
    fn star_matches_any_run_including_empty() {
        let sel = inc(&["orders*"]);
        assert!(name_ok(&sel, "orders"), "* matches the empty string");
        assert!(name_ok(&sel, "orders.eu"));
        assert!(name_ok(&sel, "orders/with/slashes"));
        assert!(name_ok(&sel, "orders with spaces"));
        assert!(!name_ok(&sel, "xorders"));
        let mid = inc(&["a*z"]);
        assert!(name_ok(&mid, "az"));
        assert!(name_ok(&mid, "a/.../z"));
        assert!(!name_ok(&mid, "azz_"));
        let all = inc(&["*"]);
        assert!(name_ok(&all, ""));
        assert!(name_ok(&all, "x y/z.ü"));
        let two = inc(&["*.*"]);
        assert!(name_ok(&two, "."));
        assert!(name_ok(&two, "a.b.c"));
        assert!(!name_ok(&two, "abc"));
    }

    #[test]
    fn question_mark_matches_exactly_one_char() {
        let sel = inc(&["q?"]);
        assert!(name_ok(&sel, "q1"));
        assert!(name_ok(&sel, "q "));
        assert!(name_ok(&sel, "q/"));
        assert!(name_ok(&sel, "qé"), "one char, even if two bytes in UTF-8");
        assert!(name_ok(&sel, "q日"), "one char of three bytes");
        assert!(!name_ok(&sel, "q"), "? does not match empty");
        assert!(!name_ok(&sel, "q12"));
        let three = inc(&["???"]);
        assert!(name_ok(&three, "abc"));
        assert!(name_ok(&three, "日本語"));
        assert!(!name_ok(&three, "ab"));
        assert!(!name_ok(&three, "abcd"));
    }

    #[test]
    fn dots_are_literal() {
        let sel = inc(&["a.b"]);
        assert!(name_ok(&sel, "a.b"));
        assert!(!name_ok(&sel, "axb"), ". is not a regex wildcard");
        let star = inc(&["events.*.created"]);
        assert!(name_ok(&star, "events.user.created"));
        assert!(name_ok(&star, "events..created"));
        assert!(!name_ok(&star, "events.user.deleted"));
        assert!(!name_ok(&star, "eventsXuserXcreated"));
    }

    #[test]
    fn names_with_spaces_slashes_and_unicode() {
        let sel = inc(&["my queue", "a/b/*", "日本*", "naïve?"]);
        assert!(name_ok(&sel, "my queue"));
        assert!(!name_ok(&sel, "my  queue"));
        assert!(!name_ok(&sel, "myqueue"));
        assert!(name_ok(&sel, "a/b/c"));
        assert!(name_ok(&sel, "a/b/"));
        assert!(!name_ok(&sel, "a/c/b"));
        assert!(name_ok(&sel, "日本"));
        assert!(name_ok(&sel, "日本語のキュー"));
        assert!(name_ok(&sel, "naïve1"));
        assert!(!name_ok(&sel, "naive1"), "ï is not i");
    }

    #[test]
    fn matching_is_case_sensitive() {
        let sel = inc(&["Orders*"]);
        assert!(name_ok(&sel, "Orders"));
        assert!(!name_ok(&sel, "orders"));
        assert!(!name_ok(&sel, "ORDERS"));
        let ex = QueueSelection {
            exclude: vec!["tmp*".into()],
            ..Default::default()
        };
        assert!(name_ok(&ex, "TMP1"), "exclude is case-sensitive too");
        assert!(!name_ok(&ex, "tmp1"));
        let vh = QueueSelection {
            vhosts: vec!["Prod".into()],
            ..Default::default()
        };
        assert!(!vh.matches("prod", "q", Classic, 0));
        assert!(vh.matches("Prod", "q", Classic, 0));
    }

    #[test]
    fn empty_pattern_matches_only_empty_name() {
        let sel = inc(&[""]);
        assert!(name_ok(&sel, ""));
        assert!(!name_ok(&sel, "a"));
    }

    #[test]
    fn brackets_and_regex_chars_are_literal() {
        let sel = inc(&["q[1]", "a+b", "(x)|y", "^s$"]);
        assert!(name_ok(&sel, "q[1]"));
        assert!(!name_ok(&sel, "q1"));
        assert!(name_ok(&sel, "a+b"));
        assert!(!name_ok(&sel, "aab"));
        assert!(name_ok(&sel, "(x)|y"));
        assert!(!name_ok(&sel, "x"));
        assert!(name_ok(&sel, "^s$"));
        assert!(!name_ok(&sel, "s"));
    }

    #[test]
    fn include_any_of_several_patterns() {
        let sel = inc(&["a*", "b?", "exact"]);
        assert!(name_ok(&sel, "alpha"));
        assert!(name_ok(&sel, "b1"));
        assert!(name_ok(&sel, "exact"));
        assert!(!name_ok(&sel, "b12"));
        assert!(!name_ok(&sel, "c"));
    }

    #[test]
    fn exclude_applies_after_include() {
        let sel = QueueSelection {
            include: vec!["orders.*".into()],
            exclude: vec!["*.dlq".into(), "orders.tmp?".into()],
            ..Default::default()
        };
        assert!(name_ok(&sel, "orders.eu"));
        assert!(!name_ok(&sel, "orders.eu.dlq"));
        assert!(!name_ok(&sel, "orders.tmp1"));
        assert!(name_ok(&sel, "orders.tmp12"));
        assert!(
            !name_ok(&sel, "payments.dlq"),
            "not included in the first place"
        );
        // Exclude alone: everything but the excluded.
        let ex = QueueSelection {
            exclude: vec!["*".into()],
            ..Default::default()
        };
        assert!(!name_ok(&ex, "x"));
        assert!(!name_ok(&ex, ""));
        // Same pattern in both: exclude wins.
        let both = QueueSelection {
            include: vec!["q".into()],
            exclude: vec!["q".into()],
            ..Default::default()
        };
        assert!(!name_ok(&both, "q"));
    }

    #[test]
    fn vhost_filter_is_exact() {
        let sel = QueueSelection {
            vhosts: vec!["/".into(), "prod".into()],
            ..Default::default()
        };
        assert!(sel.matches("/", "q", Classic, 0));
        assert!(sel.matches("prod", "q", Classic, 0));
        assert!(!sel.matches("prod2", "q", Classic, 0));
        assert!(!sel.matches("", "q", Classic, 0));
        assert!(!sel.matches("%2f", "q", Classic, 0), "no URL decoding");
        let glob = QueueSelection {
            vhosts: vec!["p*".into()],
            ..Default::default()
        };
        assert!(
            !glob.matches("prod", "q", Classic, 0),
            "vhosts are not globs"
        );
        assert!(glob.matches("p*", "q", Classic, 0));
    }

    #[test]
    fn type_filter() {
        let sel = QueueSelection {
            types: vec![Quorum, Stream],
            ..Default::default()
        };
        assert!(!sel.matches("/", "q", Classic, 0));
        assert!(sel.matches("/", "q", Quorum, 0));
        assert!(sel.matches("/", "q", Stream, 0));
        let one = QueueSelection {
            types: vec![Classic],
            ..Default::default()
        };
        assert!(one.matches("/", "q", Classic, 0));
        assert!(!one.matches("/", "q", Quorum, 0));
        assert!(!one.matches("/", "q", Stream, 0));
    }

    #[test]
    fn min_messages_boundary() {
        let sel = QueueSelection {
            min_messages: 10,
            ..Default::default()
        };
        assert!(!sel.matches("/", "q", Classic, 0));
        assert!(!sel.matches("/", "q", Classic, 9));
        assert!(sel.matches("/", "q", Classic, 10), "equal to min is kept");
        assert!(sel.matches("/", "q", Classic, 11));
        assert!(sel.matches("/", "q", Classic, u64::MAX));
        let zero = QueueSelection::default();
        assert!(
            zero.matches("/", "empty", Classic, 0),
            "default 0 keeps empty queues"
        );
        let max = QueueSelection {
            min_messages: u64::MAX,
            ..Default::default()
        };
        assert!(!max.matches("/", "q", Classic, u64::MAX - 1));
        assert!(max.matches("/", "q", Classic, u64::MAX));
    }

    #[test]
    fn all_filters_combined() {
        let sel = QueueSelection {
            include: vec!["orders*".into()],
            exclude: vec!["*.tmp".into()],
            vhosts: vec!["prod".into()],
            types: vec![Quorum],
            min_messages: 1,
        };
        assert!(sel.matches("prod", "orders.eu", Quorum, 1));
        assert!(!sel.matches("prod", "payments", Quorum, 1));
        assert!(!sel.matches("prod", "orders.tmp", Quorum, 1));
        assert!(!sel.matches("dev", "orders.eu", Quorum, 1));
        assert!(!sel.matches("prod", "orders.eu", Classic, 1));
        assert!(!sel.matches("prod", "orders.eu", Quorum, 0));
        assert!(selected(Some(&sel), "prod", "orders.eu", Quorum, 1));
        assert!(!selected(Some(&sel), "prod", "orders.eu", Quorum, 0));
    }

    #[test]
    fn explain_names_the_first_failing_rule() {
        let sel = QueueSelection {
            include: vec!["orders*".into()],
            exclude: vec!["*.tmp".into()],
            vhosts: vec!["prod".into()],
            types: vec![Quorum],
            min_messages: 5,
        };
        assert_eq!(sel.explain("prod", "orders.eu", Quorum, 5), None);
        let r = sel
            .explain("dev", "payments", Classic, 0)
            .unwrap_or_default();
        assert!(r.contains("include"), "{r}");
        assert!(r.contains("\"payments\""), "{r}");
        let r = sel
            .explain("dev", "orders.tmp", Classic, 0)
            .unwrap_or_default();
        assert!(r.contains("exclude pattern \"*.tmp\""), "{r}");
        let r = sel
            .explain("dev", "orders.eu", Classic, 0)
            .unwrap_or_default();
        assert!(
            r.contains("vhost \"dev\" is not in source.queues.vhosts"),
            "{r}"
        );
        let r = sel
            .explain("prod", "orders.eu", Classic, 0)
            .unwrap_or_default();
        assert!(
            r.contains("type classic is not in source.queues.types"),
            "{r}"
        );
        let r = sel
            .explain("prod", "orders.eu", Quorum, 4)
            .unwrap_or_default();
        assert!(r.contains("holds 4 messages"), "{r}");
        assert!(r.contains("min_messages (5)"), "{r}");
        assert_eq!(
            skip_reason(Some(&sel), "prod", "orders.eu", Quorum, 4),
            sel.explain("prod", "orders.eu", Quorum, 4)
        );
    }
}
