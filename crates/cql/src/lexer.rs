//! Splits CQL text into tokens. Unquoted identifiers and keywords are case-insensitive
//! (kept lowercased); `"quoted"` identifiers keep their case.

use crate::CqlError;

#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    /// An unquoted word, lowercased: a keyword or an identifier.
    Word(String),
    /// A `"quoted"` identifier, case preserved.
    QuotedName(String),
    String(String),
    Integer(String),
    Float(String),
    Uuid(String),
    Blob(Vec<u8>),
    Duration(String),
    /// `?`
    Question,
    /// `:name`
    NamedMarker(String),
    Symbol(&'static str),
}

impl Token {
    pub fn describe(&self) -> String {
        match self {
            Token::Word(w) => w.clone(),
            Token::QuotedName(n) => format!("\"{n}\""),
            Token::String(s) => format!("'{s}'"),
            Token::Integer(s) | Token::Float(s) | Token::Uuid(s) | Token::Duration(s) => s.clone(),
            Token::Blob(_) => "blob literal".into(),
            Token::Question => "?".into(),
            Token::NamedMarker(n) => format!(":{n}"),
            Token::Symbol(s) => (*s).into(),
        }
    }
}

const SYMBOLS: [&str; 19] = [
    "<=", ">=", "!=", "(", ")", ",", ";", ".", "*", "=", "<", ">", "[", "]", "{", "}", ":", "+",
    "-",
];

fn is_uuid_at(bytes: &[u8], position: usize) -> bool {
    let groups = [8, 4, 4, 4, 12];
    let mut at = position;
    for (i, length) in groups.iter().enumerate() {
        for _ in 0..*length {
            match bytes.get(at) {
                Some(b) if b.is_ascii_hexdigit() => at += 1,
                _ => return false,
            }
        }
        if i < 4 {
            if bytes.get(at) != Some(&b'-') {
                return false;
            }
            at += 1;
        }
    }
    !matches!(bytes.get(at), Some(b) if b.is_ascii_alphanumeric() || *b == b'_')
}

const DURATION_UNITS: [&str; 12] = [
    "mo", "ms", "us", "µs", "ns", "y", "w", "d", "h", "m", "s", "µ",
];

/// Length of a duration literal like `1h30m` or `2mo3d` at `position`, if there is one.
fn duration_length(text: &str, position: usize) -> Option<usize> {
    let rest = &text[position..];
    let mut consumed = 0;
    let mut units = 0;
    loop {
        let digits = rest[consumed..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        if digits == 0 {
            break;
        }
        let after_digits = consumed + digits;
        let unit = DURATION_UNITS
            .iter()
            .find(|unit| rest[after_digits..].to_ascii_lowercase().starts_with(*unit))?;
        consumed = after_digits + unit.len();
        units += 1;
    }
    let next_is_word = rest[consumed..]
        .chars()
        .next()
        .is_some_and(|c| c.is_alphanumeric() || c == '_');
    (units > 0 && !next_is_word).then_some(consumed)
}

pub fn tokenize(text: &str) -> Result<Vec<Token>, CqlError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut position = 0;
    while position < bytes.len() {
        let byte = bytes[position];
        if byte.is_ascii_whitespace() {
            position += 1;
            continue;
        }
        if text[position..].starts_with("--") || text[position..].starts_with("//") {
            while position < bytes.len() && bytes[position] != b'\n' {
                position += 1;
            }
            continue;
        }
        if text[position..].starts_with("/*") {
            match text[position + 2..].find("*/") {
                Some(end) => position += end + 4,
                None => return Err(CqlError::syntax("Unterminated comment")),
            }
            continue;
        }
        if byte == b'\'' {
            let (value, end) = quoted(text, position, '\'', "Unterminated string literal")?;
            tokens.push(Token::String(value));
            position = end;
            continue;
        }
        if text[position..].starts_with("$$") {
            match text[position + 2..].find("$$") {
                Some(end) => {
                    tokens.push(Token::String(
                        text[position + 2..position + 2 + end].to_string(),
                    ));
                    position += end + 4;
                }
                None => return Err(CqlError::syntax("Unterminated $$ string literal")),
            }
            continue;
        }
        if byte == b'"' {
            let (name, end) = quoted(text, position, '"', "Unterminated quoted identifier")?;
            tokens.push(Token::QuotedName(name));
            position = end;
            continue;
        }
        if byte == b'?' {
            tokens.push(Token::Question);
            position += 1;
            continue;
        }
        if byte == b':'
            && bytes
                .get(position + 1)
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        {
            let end = word_end(bytes, position + 1);
            tokens.push(Token::NamedMarker(
                text[position + 1..end].to_ascii_lowercase(),
            ));
            position = end;
            continue;
        }
        if is_uuid_at(bytes, position) {
            tokens.push(Token::Uuid(text[position..position + 36].to_string()));
            position += 36;
            continue;
        }
        if (byte == b'0') && matches!(bytes.get(position + 1), Some(b'x') | Some(b'X')) {
            let (blob, end) = blob_at(text, position)?;
            tokens.push(blob);
            position = end;
            continue;
        }
        if byte.is_ascii_digit() {
            let (number, end) = number_at(text, position);
            tokens.push(number);
            position = end;
            continue;
        }
        if byte.is_ascii_alphabetic() || byte == b'_' {
            // ISO-8601 durations (P1DT2H) are words starting with P; the planner reads them.
            let end = word_end(bytes, position);
            tokens.push(Token::Word(text[position..end].to_ascii_lowercase()));
            position = end;
            continue;
        }
        match SYMBOLS
            .iter()
            .find(|symbol| text[position..].starts_with(**symbol))
        {
            Some(symbol) => {
                tokens.push(Token::Symbol(symbol));
                position += symbol.len();
            }
            None => {
                let character = text[position..].chars().next().unwrap_or('?');
                return Err(CqlError::syntax(format!(
                    "line 1:{position} token recognition error at: '{character}'"
                )));
            }
        }
    }
    Ok(tokens)
}

/// Where the word (letters, digits, underscores) starting at `start` ends.
fn word_end(bytes: &[u8], start: usize) -> usize {
    let mut at = start;
    while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
        at += 1;
    }
    at
}

/// The text quoted by `quote` from `start` (a string literal or a quoted identifier; a
/// doubled quote stands for one), and where it ends.
fn quoted(
    text: &str,
    start: usize,
    quote: char,
    unterminated: &str,
) -> Result<(String, usize), CqlError> {
    let mut value = String::new();
    let mut at = start + 1;
    loop {
        let Some(offset) = text[at..].find(quote) else {
            return Err(CqlError::syntax(unterminated));
        };
        value.push_str(&text[at..at + offset]);
        at += offset + 1;
        if text[at..].starts_with(quote) {
            value.push(quote);
            at += 1;
        } else {
            return Ok((value, at));
        }
    }
}

/// The blob literal (`0x` and an even number of hex digits) at `position`, and where it
/// ends.
fn blob_at(text: &str, position: usize) -> Result<(Token, usize), CqlError> {
    let bytes = text.as_bytes();
    let start = position + 2;
    let mut at = start;
    while at < bytes.len() && bytes[at].is_ascii_hexdigit() {
        at += 1;
    }
    let hex = &text[start..at];
    if !hex.len().is_multiple_of(2) {
        return Err(CqlError::syntax(format!(
            "Invalid blob literal 0x{hex}: odd number of digits"
        )));
    }
    let blob = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0))
        .collect();
    Ok((Token::Blob(blob), at))
}

/// The number at `position` — a duration (`3h20m`), a float or an integer — and where it
/// ends.
fn number_at(text: &str, position: usize) -> (Token, usize) {
    let bytes = text.as_bytes();
    if let Some(length) = duration_length(text, position) {
        return (
            Token::Duration(text[position..position + length].to_string()),
            position + length,
        );
    }
    let start = position;
    let mut at = position;
    let mut is_float = false;
    while at < bytes.len() && bytes[at].is_ascii_digit() {
        at += 1;
    }
    if bytes.get(at) == Some(&b'.') && bytes.get(at + 1).is_some_and(u8::is_ascii_digit) {
        is_float = true;
        at += 1;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
    }
    if matches!(bytes.get(at), Some(b'e') | Some(b'E')) {
        let mut exponent = at + 1;
        if matches!(bytes.get(exponent), Some(b'+') | Some(b'-')) {
            exponent += 1;
        }
        if bytes.get(exponent).is_some_and(u8::is_ascii_digit) {
            is_float = true;
            at = exponent;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                at += 1;
            }
        }
    }
    let literal = text[start..at].to_string();
    let token = if is_float {
        Token::Float(literal)
    } else {
        Token::Integer(literal)
    };
    (token, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes_literals_and_names() {
        let tokens = tokenize(
            "SELECT \"MyCol\", x FROM t WHERE k = 'it''s' AND u = 123e4567-e89b-12d3-a456-426614174000 \
             AND b = 0xCAFE AND d = 1h30m AND f = -1.5e3 AND n = :name -- comment",
        )
        .unwrap();
        assert!(tokens.contains(&Token::QuotedName("MyCol".into())));
        assert!(tokens.contains(&Token::String("it's".into())));
        assert!(tokens.contains(&Token::Uuid("123e4567-e89b-12d3-a456-426614174000".into())));
        assert!(tokens.contains(&Token::Blob(vec![0xca, 0xfe])));
        assert!(tokens.contains(&Token::Duration("1h30m".into())));
        assert!(tokens.contains(&Token::Float("1.5e3".into())));
        assert!(tokens.contains(&Token::NamedMarker("name".into())));
        assert_eq!(tokens[0], Token::Word("select".into()));
    }

    #[test]
    fn bad_input_is_a_syntax_error() {
        assert!(tokenize("SELECT 'unterminated").is_err());
        assert!(tokenize("SELECT ~ FROM t").is_err());
        assert!(tokenize("SELECT 0xABC").is_err());
    }
}
