//! Which echoes a check asks for, once the echoes were asked directly: the one rule the CLI,
//! the operator and the bounded runner share.

/// Why no echo can be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoEcho {
    #[error("no echo URL is configured")]
    NoneConfigured,
    /// A scheme that is configured has no echo that answered directly.
    #[error("no {} echo answers the checker directly", if *.https { "https" } else { "http" })]
    NoneUp { https: bool },
}

/// Per scheme configured, http first and then https, the first echo of `echoes` (in their
/// configured order) that answered directly. A proxy is judged on every scheme configured, so
/// a scheme with none up fails the choice rather than being left out.
pub fn choose_echoes<T>(
    echoes: &[T],
    is_https: impl Fn(&T) -> bool,
    answered: impl Fn(&T) -> bool,
) -> Result<Vec<&T>, NoEcho> {
    let mut chosen = Vec::new();
    for https in [false, true] {
        let mut of_scheme = echoes.iter().filter(|e| is_https(e) == https).peekable();
        if of_scheme.peek().is_none() {
            continue;
        }
        chosen.push(
            of_scheme
                .find(|e| answered(e))
                .ok_or(NoEcho::NoneUp { https })?,
        );
    }
    if chosen.is_empty() {
        return Err(NoEcho::NoneConfigured);
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pick(echoes: &[(&'static str, bool)]) -> Result<Vec<&'static str>, NoEcho> {
        choose_echoes(echoes, |e| e.0.starts_with("https"), |e| e.1)
            .map(|v| v.into_iter().map(|e| e.0).collect())
    }

    #[test]
    fn the_first_up_of_each_scheme_http_first() {
        let echoes = [
            ("https://a", false),
            ("https://b", true),
            ("http://c", false),
            ("http://d", true),
            ("http://e", true),
        ];
        assert_eq!(pick(&echoes), Ok(vec!["http://d", "https://b"]));
        assert_eq!(pick(&[("https://a", true)]), Ok(vec!["https://a"]));
    }

    #[test]
    fn a_scheme_configured_with_none_up_fails_the_choice_and_is_named() {
        let echoes = [("http://a", true), ("https://b", false)];
        assert_eq!(pick(&echoes), Err(NoEcho::NoneUp { https: true }));
        assert_eq!(
            NoEcho::NoneUp { https: true }.to_string(),
            "no https echo answers the checker directly"
        );
        assert_eq!(pick(&[]), Err(NoEcho::NoneConfigured));
    }
}
