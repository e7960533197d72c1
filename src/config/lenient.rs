//! Loading a configuration where its run's environment is missing: `config check` on the
//! machine where the file is edited, and the storage commands' `--config`, which need the
//! storage section only. Secrets and dates are set where the job runs (`${RABBITMQ_PASSWORD}`,
//! `nightly-${BACKUP_DATE}`, a Secret mounted at `/secrets`), so an unset variable or a secret
//! file that is not there is noted with the key it stands in, and a placeholder takes its place
//! so that everything else is still checked.
//!
//! Off by default: [`collecting`] turns it on for the current thread while it runs a load.

use std::cell::RefCell;

/// What a run will need that is not here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// An environment variable a `${NAME}` reference names, unset here.
    Variable(String),
    /// A `*_file` secret whose file does not exist here.
    File(std::path::PathBuf),
}

/// One missing thing and the key path it stands in (`source.amqp_url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Absent {
    /// The variable or file.
    pub missing: Missing,
    /// The configuration key whose value needs it.
    pub key: String,
}

/// The value put in place of a missing one: a word valid as a password, a key and a path
/// component, so that the rest of the file is checked as it would be.
pub const PLACEHOLDER: &str = "unset-here";

thread_local! {
    static NOTED: RefCell<Option<Vec<Absent>>> = const { RefCell::new(None) };
}

/// Runs `load` with missing variables and secret files noted instead of refused, and returns
/// its result with what was noted, in the order met (each variable once per key).
pub fn collecting<T>(load: impl FnOnce() -> T) -> (T, Vec<Absent>) {
    let before = NOTED.with(|n| n.borrow_mut().replace(Vec::new()));
    let out = load();
    let noted = NOTED.with(|n| std::mem::replace(&mut *n.borrow_mut(), before));
    (out, noted.unwrap_or_default())
}

/// Notes `missing` for `key` when [`collecting`] runs on this thread, and returns the
/// placeholder to use; `None` (refuse, as a run does) otherwise.
pub(super) fn note(missing: Missing, key: &str) -> Option<&'static str> {
    NOTED.with(|n| {
        let mut n = n.borrow_mut();
        let list = n.as_mut()?;
        let absent = Absent {
            missing,
            key: key.to_string(),
        };
        if !list.contains(&absent) {
            list.push(absent);
        }
        Some(PLACEHOLDER)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noted_only_while_collecting() {
        assert_eq!(note(Missing::Variable("A".into()), "k"), None);
        let (_, noted) = collecting(|| {
            assert_eq!(note(Missing::Variable("A".into()), "k"), Some(PLACEHOLDER));
            note(Missing::Variable("A".into()), "k");
            note(Missing::Variable("A".into()), "other");
        });
        assert_eq!(noted.len(), 2);
        assert_eq!(note(Missing::Variable("A".into()), "k"), None);
    }
}
