//! Panics inside libraries weft calls (the `tokenizers` crate on a damaged `tokenizer.json`,
//! `object_store` on a setting it does not check) turned into errors: [`contained`].

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs library code under [`contained`].
    static CONTAINED: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once per process, a panic hook that stays silent for panics raised under
/// [`contained`] on the same thread and hands every other panic to the hook it replaced (the
/// default one, or whatever the program had set), so that they print as before.
fn install_quiet_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINED.try_with(Cell::get).unwrap_or(false) {
                previous(info);
            }
        }));
    });
}

/// Runs `f` (a call into a library), turning a panic inside it into `Err` with the panic's
/// message. The panic hook stays quiet for it (see [`install_quiet_hook`]), so the user sees the
/// caller's one error line, not "thread panicked at ...".
///
/// What this cannot silence: a panic on a thread the library spawns itself, and anything after a
/// program replaces the hook with its own that ignores the one it replaced. The panic is
/// contained in either case; only its message would print. The caller must not reuse state a
/// panic may have left half-updated except through this function again
/// (`AssertUnwindSafe`).
pub(crate) fn contained<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_quiet_hook();
    let outer = CONTAINED.with(|c| c.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    CONTAINED.with(|c| c.set(outer));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_its_message_and_the_flag_is_put_back() {
        assert_eq!(contained(|| 3), Ok(3));
        assert_eq!(
            contained(|| -> u8 { panic!("inner {}", 7) }),
            Err("inner 7".to_string())
        );
        assert!(!CONTAINED.with(Cell::get), "the flag is put back");
        // nested: the outer call's flag survives the inner one
        let nested = contained(|| {
            let inner = contained(|| -> u8 { panic!("deep") });
            (inner, CONTAINED.with(Cell::get))
        });
        assert_eq!(nested, Ok((Err("deep".to_string()), true)));
    }
}
