//! [`near_miss()`]: the "did you mean" suggestion for a mistyped name (a config group, a key, a
//! setting), shared by composition and by the other crates that check names.

/// The candidate closest to `name`, when it is close enough to be a plausible typo.
pub fn near_miss<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let d = strsim::damerau_levenshtein(name, c);
        let limit = (name.chars().count().max(c.chars().count()) / 3).max(1);
        let plausible = d <= limit || c.starts_with(name) && !name.is_empty();
        if plausible && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}
