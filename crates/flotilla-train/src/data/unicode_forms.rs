//! A tokenizer normalizer that only applies Unicode normalization forms (NFC, NFD, NFKC, NFKD,
//! or a sequence of them, as Qwen2's NFC) leaves a text already in those forms unchanged, with
//! every character aligned to itself. Such a text can be encoded by a copy of the tokenizer
//! without its normalizer: the same ids and offsets, without the per-character normalization
//! pass that is a fifth of the encoding time of long chat texts.

use tokenizers::NormalizerWrapper;
use unicode_normalization::{
    is_nfc_quick, is_nfd_quick, is_nfkc_quick, is_nfkd_quick, IsNormalized,
};

/// A Unicode normalization form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnicodeForm {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
}

/// The forms `normalizer` applies, when that is all it does; `None` when it does anything else
/// (lower-casing, replacing, prepending, ...).
pub(crate) fn unicode_forms(normalizer: &NormalizerWrapper) -> Option<Vec<UnicodeForm>> {
    match normalizer {
        NormalizerWrapper::NFC(_) => Some(vec![UnicodeForm::Nfc]),
        NormalizerWrapper::NFD(_) => Some(vec![UnicodeForm::Nfd]),
        NormalizerWrapper::NFKC(_) => Some(vec![UnicodeForm::Nfkc]),
        NormalizerWrapper::NFKD(_) => Some(vec![UnicodeForm::Nfkd]),
        NormalizerWrapper::Sequence(seq) => {
            let mut forms = vec![];
            for n in seq.as_ref() {
                forms.extend(unicode_forms(n)?);
            }
            Some(forms)
        }
        _ => None,
    }
}

/// Whether `text` is certainly in every one of `forms` (the quick check of UAX #15; a "maybe"
/// counts as no, and the caller normalizes).
pub(crate) fn already_in(text: &str, forms: &[UnicodeForm]) -> bool {
    if text.is_ascii() {
        return true;
    }
    forms.iter().all(|form| {
        let chars = text.chars();
        let quick = match form {
            UnicodeForm::Nfc => is_nfc_quick(chars),
            UnicodeForm::Nfd => is_nfd_quick(chars),
            UnicodeForm::Nfkc => is_nfkc_quick(chars),
            UnicodeForm::Nfkd => is_nfkd_quick(chars),
        };
        quick == IsNormalized::Yes
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::normalizers::{unicode::NFC, unicode::NFKC, Lowercase, Sequence};

    #[test]
    fn only_pure_unicode_normalizers_have_forms() {
        assert_eq!(
            unicode_forms(&NormalizerWrapper::NFC(NFC)),
            Some(vec![UnicodeForm::Nfc])
        );
        let seq = Sequence::new(vec![NFC.into(), NFKC.into()]);
        assert_eq!(
            unicode_forms(&NormalizerWrapper::Sequence(seq)),
            Some(vec![UnicodeForm::Nfc, UnicodeForm::Nfkc])
        );
        let seq = Sequence::new(vec![NFC.into(), Lowercase.into()]);
        assert_eq!(unicode_forms(&NormalizerWrapper::Sequence(seq)), None);
    }

    #[test]
    fn composed_text_is_in_nfc_and_decomposed_text_is_not() {
        assert!(already_in("plain ascii", &[UnicodeForm::Nfc]));
        assert!(already_in("caf\u{e9} 🦀 日本", &[UnicodeForm::Nfc]));
        assert!(!already_in("cafe\u{301}", &[UnicodeForm::Nfc]));
        assert!(!already_in("caf\u{e9}", &[UnicodeForm::Nfd]));
        // the ligature ﬁ is NFC but not NFKC
        assert!(already_in("\u{fb01}", &[UnicodeForm::Nfc]));
        assert!(!already_in(
            "\u{fb01}",
            &[UnicodeForm::Nfc, UnicodeForm::Nfkc]
        ));
    }
}
