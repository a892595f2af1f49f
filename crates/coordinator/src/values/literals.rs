//! CQL literals typed against their receiver: numbers, strings, blobs, booleans, uuids,
//! and the text forms of dates, times, timestamps, durations and inet addresses, parsed
//! as Cassandra parses them.

use super::{date_from_days, type_error};
use crate::CqlError;
use num_bigint::BigInt;
use shoal_cql::ast::Literal;
use shoal_model::{CqlType, Value};
use std::net::IpAddr;
use std::str::FromStr;

fn parse_integer(text: &str, negative: bool) -> Option<BigInt> {
    let value = BigInt::from_str(text).ok()?;
    Some(if negative { -value } else { value })
}

/// Converts a literal to a value of `cql_type`, as Cassandra's type checking allows.
pub fn literal_value(
    literal: &Literal,
    cql_type: &CqlType,
    receiver: &str,
    negative: bool,
) -> Result<Value, CqlError> {
    let sign = if negative { "-" } else { "" };
    let out_of_range = || {
        CqlError::invalid(format!(
            "Invalid value for {receiver}: number out of range for {cql_type}"
        ))
    };
    match (literal, cql_type) {
        (Literal::Integer(text), _)
            if cql_type.is_numeric()
                || matches!(cql_type, CqlType::Timestamp | CqlType::Date | CqlType::Time) =>
        {
            let integer = parse_integer(text, negative).ok_or_else(out_of_range)?;
            let as_i64 = || i64::try_from(&integer).map_err(|_| out_of_range());
            Ok(match cql_type {
                CqlType::Tinyint => {
                    Value::Tinyint(i8::try_from(&integer).map_err(|_| out_of_range())?)
                }
                CqlType::Smallint => {
                    Value::Smallint(i16::try_from(&integer).map_err(|_| out_of_range())?)
                }
                CqlType::Int => Value::Int(i32::try_from(&integer).map_err(|_| out_of_range())?),
                CqlType::Bigint => Value::Bigint(as_i64()?),
                CqlType::Counter => Value::Counter(as_i64()?),
                CqlType::Varint => Value::Varint(integer),
                CqlType::Decimal => Value::Decimal {
                    unscaled: integer,
                    scale: 0,
                },
                CqlType::Float => Value::Float(
                    format!("{sign}{text}")
                        .parse()
                        .map_err(|_| out_of_range())?,
                ),
                CqlType::Double => Value::Double(
                    format!("{sign}{text}")
                        .parse()
                        .map_err(|_| out_of_range())?,
                ),
                CqlType::Timestamp => Value::Timestamp(as_i64()?),
                CqlType::Date => Value::Date(u32::try_from(&integer).map_err(|_| out_of_range())?),
                CqlType::Time => {
                    let nanos = as_i64()?;
                    if !(0..shoal_model::value::NANOSECONDS_PER_DAY).contains(&nanos) {
                        return Err(out_of_range());
                    }
                    Value::Time(nanos)
                }
                _ => return Err(type_error(receiver, cql_type, "integer")),
            })
        }
        (Literal::Float(text), CqlType::Float) => Ok(Value::Float(
            format!("{sign}{text}")
                .parse()
                .map_err(|_| out_of_range())?,
        )),
        (Literal::Float(text), CqlType::Double) => Ok(Value::Double(
            format!("{sign}{text}")
                .parse()
                .map_err(|_| out_of_range())?,
        )),
        (Literal::Float(text), CqlType::Decimal) => {
            parse_decimal(&format!("{sign}{text}")).ok_or_else(out_of_range)
        }
        (Literal::NaN, CqlType::Float) => Ok(Value::Float(f32::NAN)),
        (Literal::NaN, CqlType::Double) => Ok(Value::Double(f64::NAN)),
        (Literal::Infinity, CqlType::Float) => Ok(Value::Float(if negative {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        })),
        (Literal::Infinity, CqlType::Double) => Ok(Value::Double(if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        })),
        (_, _) if negative => Err(CqlError::invalid(format!(
            "Invalid negative value for {receiver} of type {cql_type}"
        ))),
        (Literal::String(text), CqlType::Text) => Ok(Value::Text(text.clone())),
        (Literal::String(text), CqlType::Ascii) => {
            if !text.is_ascii() {
                return Err(CqlError::invalid(format!(
                    "Invalid ASCII character in string literal for {receiver}"
                )));
            }
            Ok(Value::Ascii(text.clone()))
        }
        (Literal::String(text), CqlType::Timestamp) => {
            parse_timestamp(text).map(Value::Timestamp).ok_or_else(|| {
                CqlError::invalid(format!(
                    "Unable to coerce '{text}' to a formatted date (long)"
                ))
            })
        }
        (Literal::String(text), CqlType::Date) => parse_date(text)
            .map(|days| Value::Date(date_from_days(days)))
            .ok_or_else(|| {
                CqlError::invalid(format!(
                    "Unable to coerce '{text}' to a formatted date (long)"
                ))
            }),
        (Literal::String(text), CqlType::Time) => {
            parse_time(text).map(Value::Time).ok_or_else(|| {
                CqlError::invalid(format!(
                    "Unable to coerce '{text}' to a formatted time (long)"
                ))
            })
        }
        (Literal::String(text), CqlType::Inet) => IpAddr::from_str(text)
            .map(Value::Inet)
            .map_err(|_| CqlError::invalid(format!("Unable to make inet address from '{text}'"))),
        (Literal::Boolean(b), CqlType::Boolean) => Ok(Value::Boolean(*b)),
        (Literal::Uuid(text), CqlType::Uuid | CqlType::Timeuuid) => {
            let parsed =
                uuid::Uuid::parse_str(text).map_err(|_| type_error(receiver, cql_type, "uuid"))?;
            let bytes = *parsed.as_bytes();
            if *cql_type == CqlType::Timeuuid {
                if parsed.get_version_num() != 1 {
                    return Err(CqlError::invalid(format!(
                        "Invalid UUID constant ({text}) for \"{receiver}\" of type timeuuid"
                    )));
                }
                Ok(Value::Timeuuid(bytes))
            } else {
                Ok(Value::Uuid(bytes))
            }
        }
        (Literal::Blob(bytes), CqlType::Blob) => Ok(Value::Blob(bytes.clone())),
        (Literal::Duration(text), CqlType::Duration) => parse_duration(text)
            .ok_or_else(|| CqlError::invalid(format!("Unable to convert '{text}' to a duration"))),
        (Literal::String(_), _) => Err(type_error(receiver, cql_type, "string")),
        (Literal::Integer(_), _) => Err(type_error(receiver, cql_type, "integer")),
        (Literal::Float(_), _) => Err(type_error(receiver, cql_type, "float")),
        (Literal::Boolean(_), _) => Err(type_error(receiver, cql_type, "boolean")),
        (Literal::Uuid(_), _) => Err(type_error(receiver, cql_type, "uuid")),
        (Literal::Blob(_), _) => Err(type_error(receiver, cql_type, "blob")),
        (Literal::Duration(_), _) => Err(type_error(receiver, cql_type, "duration")),
        (Literal::NaN | Literal::Infinity, _) => Err(type_error(receiver, cql_type, "float")),
        (Literal::Null, _) => Err(CqlError::invalid(format!(
            "Invalid null value for {receiver}"
        ))),
    }
}

fn parse_decimal(text: &str) -> Option<Value> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{integer}{fraction}");
    Some(Value::Decimal {
        unscaled: BigInt::from_str(&digits).ok()?,
        scale: fraction.len() as i32 - exponent,
    })
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = month as i64;
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day as i64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The civil date of a day count since the epoch.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + if month <= 2 { 1 } else { 0 };
    (year, month, day)
}

fn parse_date(text: &str) -> Option<i64> {
    let mut parts = text.trim().splitn(3, '-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: u32 = parts.next()?.parse().ok()?;
    let day: u32 = parts.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day))
}

/// `hh:mm[:ss[.fffffffff]]` to nanoseconds since midnight.
fn parse_time(text: &str) -> Option<i64> {
    let (clock, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    let mut parts = clock.split(':');
    let hours: i64 = parts.next()?.parse().ok()?;
    let minutes: i64 = parts.next()?.parse().ok()?;
    let seconds: i64 = parts.next().map_or(Some(0), |s| s.parse().ok())?;
    if hours > 23
        || minutes > 59
        || seconds > 59
        || fraction.len() > 9
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let nanos: i64 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<9}").parse().ok()?
    };
    Some(((hours * 60 + minutes) * 60 + seconds) * 1_000_000_000 + nanos)
}

/// Cassandra's accepted timestamp strings: `yyyy-mm-dd[( |T)hh:mm[:ss[.fff]]][zone]`, zone
/// being `Z`, `+hh`, `+hhmm` or `+hh:mm` (UTC when absent). Milliseconds since the epoch.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let text = text.trim();
    // `get` rather than indexing: byte 10 need not be a character boundary.
    let days = parse_date(text.get(..10)?)?;
    let mut rest = text.get(10..)?;
    let mut millis_of_day = 0i64;
    if rest.starts_with(' ') || rest.starts_with('T') {
        rest = &rest[1..];
        let zone_start = rest.find(['+', '-', 'Z', 'z', ' ']).unwrap_or(rest.len());
        let clock = &rest[..zone_start];
        let nanos = parse_time(clock)?;
        millis_of_day = nanos / 1_000_000;
        rest = rest[zone_start..].trim_start();
    }
    let offset_minutes: i64 = if rest.is_empty()
        || rest.eq_ignore_ascii_case("z")
        || rest.eq_ignore_ascii_case("utc")
        || rest.eq_ignore_ascii_case("gmt")
    {
        0
    } else {
        let sign = match rest.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let digits: String = rest[1..].chars().filter(|c| *c != ':').collect();
        let (hours, minutes) = match digits.len() {
            2 => (digits.parse::<i64>().ok()?, 0),
            4 => (
                digits.get(..2)?.parse::<i64>().ok()?,
                digits.get(2..)?.parse::<i64>().ok()?,
            ),
            _ => return None,
        };
        sign * (hours * 60 + minutes)
    };
    Some(days * 86_400_000 + millis_of_day - offset_minutes * 60_000)
}

/// Durations: `1h30m`, `2mo3d`, `-1d` (units y mo w d h m s ms us/µs ns) or ISO 8601
/// `P1Y2M3DT4H5M6S` / `P2W`.
pub fn parse_duration(text: &str) -> Option<Value> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mut months, mut days, mut nanos) = (0i64, 0i64, 0i64);
    if let Some(iso) = body.strip_prefix('P').or_else(|| body.strip_prefix('p')) {
        let mut in_time = false;
        let mut number = String::new();
        for c in iso.chars() {
            match c {
                '0'..='9' => number.push(c),
                'T' | 't' => in_time = true,
                _ => {
                    let n: i64 = number.parse().ok()?;
                    number.clear();
                    match (c.to_ascii_uppercase(), in_time) {
                        ('Y', false) => months += n * 12,
                        ('M', false) => months += n,
                        ('W', false) => days += n * 7,
                        ('D', false) => days += n,
                        ('H', true) => nanos += n * 3_600_000_000_000,
                        ('M', true) => nanos += n * 60_000_000_000,
                        ('S', true) => nanos += n * 1_000_000_000,
                        _ => return None,
                    }
                }
            }
        }
        if !number.is_empty() {
            return None;
        }
    } else {
        let lower = body.to_ascii_lowercase();
        let mut rest = lower.as_str();
        if rest.is_empty() {
            return None;
        }
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return None;
            }
            let n: i64 = rest[..digits].parse().ok()?;
            rest = &rest[digits..];
            let units: [(&str, i64, u8); 11] = [
                ("mo", 1, 0),
                ("ms", 1_000_000, 2),
                ("us", 1_000, 2),
                ("µs", 1_000, 2),
                ("ns", 1, 2),
                ("y", 12, 0),
                ("w", 7, 1),
                ("d", 1, 1),
                ("h", 3_600_000_000_000, 2),
                ("m", 60_000_000_000, 2),
                ("s", 1_000_000_000, 2),
            ];
            let (unit, factor, field) = units.iter().find(|(unit, _, _)| rest.starts_with(unit))?;
            rest = &rest[unit.len()..];
            match field {
                0 => months += n * factor,
                1 => days += n * factor,
                _ => nanos += n * factor,
            }
        }
    }
    let sign = if negative { -1 } else { 1 };
    Some(Value::Duration {
        months: i32::try_from(months * sign).ok()?,
        days: i32::try_from(days * sign).ok()?,
        nanoseconds: nanos * sign,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{new_timeuuid, timeuuid_millis};

    #[test]
    fn timestamps_parse_like_cassandra() {
        assert_eq!(parse_timestamp("1970-01-01"), Some(0));
        assert_eq!(
            parse_timestamp("2011-02-03 04:05:06+0000"),
            Some(1_296_705_906_000)
        );
        assert_eq!(
            parse_timestamp("2011-02-03T04:05:06.789Z"),
            Some(1_296_705_906_789)
        );
        assert_eq!(
            parse_timestamp("2011-02-03 04:05+01:00"),
            Some(1_296_702_300_000)
        );
        assert_eq!(parse_timestamp("yesterday"), None);
        // Byte 10 inside a multi-byte character, and a zone of non-ASCII "digits".
        assert_eq!(parse_timestamp("2011-02-0€ 04:05"), None);
        assert_eq!(parse_timestamp("2011-02-03 04:05+€1"), None);
    }

    proptest::proptest! {
        /// Whatever text a client sends as a date, time, timestamp, duration or decimal,
        /// parsing answers (a value or `None`) and never panics.
        #[test]
        fn text_literals_never_panic(text in "\\PC{0,40}") {
            let _ = parse_timestamp(&text);
            let _ = parse_date(&text);
            let _ = parse_time(&text);
            let _ = parse_duration(&text);
            let _ = parse_decimal(&text);
        }

        #[test]
        fn timestamp_shaped_text_never_panics(
            date in "[0-9]{4}-[0-9]{2}-[0-9€é]{1,3}",
            rest in "[ T]?[0-9:.€]{0,12}[+Zz-]?[0-9:€é]{0,6}",
        ) {
            let _ = parse_timestamp(&format!("{date}{rest}"));
        }
    }

    #[test]
    fn civil_dates_round_trip() {
        for days in [-800_000, -1, 0, 1, 18_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn durations_and_decimals_parse() {
        assert_eq!(
            parse_duration("1h30m"),
            Some(Value::Duration {
                months: 0,
                days: 0,
                nanoseconds: 5_400_000_000_000
            })
        );
        assert_eq!(
            parse_duration("P1Y2DT3S"),
            Some(Value::Duration {
                months: 12,
                days: 2,
                nanoseconds: 3_000_000_000
            })
        );
        assert_eq!(
            parse_decimal("1.25"),
            Some(Value::Decimal {
                unscaled: BigInt::from(125),
                scale: 2
            })
        );
    }

    #[test]
    fn literals_are_checked_against_types() {
        assert!(literal_value(
            &Literal::Integer("300".into()),
            &CqlType::Tinyint,
            "c",
            false
        )
        .is_err());
        assert!(literal_value(&Literal::String("x".into()), &CqlType::Int, "c", false).is_err());
        assert_eq!(
            literal_value(&Literal::Integer("5".into()), &CqlType::Int, "c", true).unwrap(),
            Value::Int(-5)
        );
        let timeuuid = new_timeuuid();
        assert_eq!(timeuuid[6] >> 4, 1);
        assert!(
            (timeuuid_millis(&timeuuid) - shoal_model::timestamp::now_micros() / 1000).abs()
                < 5_000
        );
    }
}
