//! Full-text search terms.
//!
//! A page is indexed under the terms of its title and text; a query finds the pages that
//! have every term of the query. A term is a lower-cased run of letters and digits in a
//! script that separates words with spaces, or — for Japanese, Chinese and Korean, which
//! do not — every pair of adjacent characters (bigrams), so a query for `日本語` finds
//! `日本語のページ` through its bigrams `日本` and `本語`. A lone character of such a script
//! is a term of its own.
//!
//! Both stores keep an inverted index `term → titles` and update it by the difference
//! between a page's old and new terms.

use std::collections::BTreeSet;

/// Terms longer than this are cut (a term is a key in the index).
const MAX_TERM_CHARS: usize = 64;

/// True for the characters of scripts written without spaces between words.
fn is_unspaced(character: char) -> bool {
    matches!(character,
        '\u{3040}'..='\u{30ff}'   // hiragana, katakana
        | '\u{3400}'..='\u{4dbf}' // CJK extension A
        | '\u{4e00}'..='\u{9fff}' // CJK unified ideographs
        | '\u{f900}'..='\u{faff}' // CJK compatibility ideographs
        | '\u{ac00}'..='\u{d7af}' // hangul syllables
        | '\u{ff66}'..='\u{ff9f}' // half-width katakana
    )
}

/// The terms of a text, each once, sorted.
pub fn terms(text: &str) -> BTreeSet<String> {
    let mut terms = BTreeSet::new();
    let mut word = String::new();
    let mut run: Vec<char> = Vec::new();
    let flush_word = |word: &mut String, terms: &mut BTreeSet<String>| {
        if !word.is_empty() {
            terms.insert(word.chars().take(MAX_TERM_CHARS).collect());
            word.clear();
        }
    };
    let flush_run = |run: &mut Vec<char>, terms: &mut BTreeSet<String>| {
        match run.len() {
            0 => {}
            1 => {
                terms.insert(run[0].to_string());
            }
            _ => {
                for pair in run.windows(2) {
                    terms.insert(pair.iter().collect());
                }
            }
        }
        run.clear();
    };
    for character in text.chars() {
        if is_unspaced(character) {
            flush_word(&mut word, &mut terms);
            run.push(character);
        } else if character.is_alphanumeric() {
            flush_run(&mut run, &mut terms);
            word.extend(character.to_lowercase());
        } else {
            flush_word(&mut word, &mut terms);
            flush_run(&mut run, &mut terms);
        }
    }
    flush_word(&mut word, &mut terms);
    flush_run(&mut run, &mut terms);
    terms
}

/// The terms a page is indexed under: those of its title and of its text.
pub fn page_terms(title: &str, text: &str) -> BTreeSet<String> {
    let mut all = terms(title);
    all.extend(terms(text));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> Vec<String> {
        terms(text).into_iter().collect()
    }

    #[test]
    fn words_are_lower_cased_and_split_on_anything_else() {
        assert_eq!(list("Hello, hello WORLD-42!"), ["42", "hello", "world"]);
    }

    #[test]
    fn japanese_is_indexed_by_bigrams() {
        assert_eq!(
            list("日本語のページ"),
            ["のペ", "ペー", "ージ", "日本", "本語", "語の"]
        );
        assert_eq!(list("語"), ["語"]);
    }

    #[test]
    fn a_query_for_part_of_a_japanese_word_is_a_subset_of_its_terms() {
        assert!(terms("日本語").is_subset(&terms("これは日本語のページ")));
    }

    #[test]
    fn mixed_scripts_split_where_the_script_changes() {
        assert_eq!(list("Shoalのwiki"), ["shoal", "wiki", "の"]);
    }
}
