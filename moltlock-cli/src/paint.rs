//! Colour on terminals, never with `NO_COLOR`.

/// Whether to colour output: only on a terminal, and never with NO_COLOR.
pub fn colour(stream_is_terminal: bool) -> bool {
    stream_is_terminal && std::env::var_os("NO_COLOR").is_none()
}

/// Paints `text` with an ANSI colour code when `on`.
pub fn paint(text: &str, code: &str, on: bool) -> String {
    if on {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paint_only_when_asked() {
        assert_eq!(paint("x", "32", false), "x");
        assert_eq!(paint("x", "32", true), "\x1b[32mx\x1b[0m");
        assert!(!colour(false));
    }
}
