//! Undo by guard: an operation that creates several things registers, right after each step,
//! how to undo it; if the operation returns early (an error, a `?`, a panic) the guard undoes
//! every registered step, last first. [`Undo::commit`] keeps them all. Values that must live
//! exactly as long as the operation (claims) are held by the guard too and dropped after the
//! undos ran, so nothing half-created is ever visible without its claim.
//!
//! "Nothing half-created remains" is then a property of the code's shape: a step that can fail
//! comes before its undo is pushed, a step that succeeded has one.

/// Anything the guard holds until it ends.
trait Held {}
impl<T> Held for T {}

enum Step<'a> {
    /// What the step made, and how to take it back.
    Undo(String, Box<dyn FnOnce() -> Result<(), String> + 'a>),
    /// A value dropped when the guard ends, in either outcome.
    Hold(#[expect(dead_code, reason = "never read, only dropped")] Box<dyn Held + 'a>),
}

/// The undo stack of one operation; see the module documentation.
pub struct Undo<'a> {
    what: String,
    steps: Vec<Step<'a>>,
    committed: bool,
}

impl<'a> Undo<'a> {
    /// An empty stack for the operation `what` (named in the warnings of failed undos).
    pub fn new(what: impl Into<String>) -> Undo<'a> {
        Undo {
            what: what.into(),
            steps: Vec::new(),
            committed: false,
        }
    }

    /// Registers the undo of a step that has just succeeded: `made` names what it made.
    pub fn push(
        &mut self,
        made: impl Into<String>,
        undo: impl FnOnce() -> Result<(), String> + 'a,
    ) {
        self.steps.push(Step::Undo(made.into(), Box::new(undo)));
    }

    /// Holds `value` until the guard ends (committed or not), dropping it after the undos
    /// registered before it ran.
    pub fn hold<T: 'a>(&mut self, value: T) {
        self.steps.push(Step::Hold(Box::new(value)));
    }

    /// The operation succeeded: keeps every step and drops what the guard holds.
    pub fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for Undo<'_> {
    /// Last first: a failed undo is logged and the others still run (teardown collects every
    /// error instead of stopping at the first).
    fn drop(&mut self) {
        while let Some(step) = self.steps.pop() {
            match step {
                Step::Undo(made, undo) if !self.committed => {
                    if let Err(e) = undo() {
                        log::warn!("{}: undoing {made}: {e}", self.what);
                    }
                }
                Step::Undo(..) | Step::Hold(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Undo;
    use std::cell::RefCell;

    /// Undos run last first and only without a commit; held values drop in either case, after
    /// the undos registered before them ran; a failing undo does not stop the others.
    #[test]
    fn undoes_in_reverse_unless_committed() {
        let log = RefCell::new(Vec::new());
        struct Noisy<'a>(&'a RefCell<Vec<String>>);
        impl Drop for Noisy<'_> {
            fn drop(&mut self) {
                self.0.borrow_mut().push("claim released".into());
            }
        }
        {
            let mut u = Undo::new("test");
            u.hold(Noisy(&log));
            u.push("a", || {
                log.borrow_mut().push("undo a".into());
                Ok(())
            });
            u.push("b", || {
                log.borrow_mut().push("undo b".into());
                Err("b failed".into())
            });
        }
        assert_eq!(
            *log.borrow(),
            ["undo b", "undo a", "claim released"].map(String::from)
        );
        log.borrow_mut().clear();
        let mut u = Undo::new("test");
        u.hold(Noisy(&log));
        u.push("a", || {
            log.borrow_mut().push("undo a".into());
            Ok(())
        });
        u.commit();
        assert_eq!(*log.borrow(), ["claim released".to_string()]);
    }
}
