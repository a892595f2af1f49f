use super::*;

fn query_body(text: &str) -> Vec<u8> {
    let mut body = (text.len() as i32).to_be_bytes().to_vec();
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(&[0, 1, 0]); // consistency ONE, no flags
    body
}

#[test]
fn a_query_is_judged_by_its_first_word() {
    let start = |text: &str| query_text_start(&query_body(text)).map(<[u8]>::to_vec);
    assert_eq!(
        start("  \n SELECT * FROM t"),
        Some(b"SELECT * FROM t".to_vec())
    );
    assert_eq!(
        start("INSERT INTO t (k) VALUES (1)").unwrap()[..6],
        *b"INSERT"
    );
    // Bodies too short for what they announce are nobody's first word.
    assert_eq!(query_text_start(&[0, 0, 0, 9, b's']), None);
    assert_eq!(query_text_start(&[0xff, 0xff, 0xff, 0xff]), None);
    assert_eq!(query_text_start(&[0, 0]), None);
}

#[test]
fn an_execute_body_starts_with_its_statement_id() {
    assert_eq!(prepared_id(&[0, 2, 7, 9, 0, 1]), Some(&[7, 9][..]));
    assert_eq!(prepared_id(&[0, 4, 7, 9]), None);
    assert_eq!(prepared_id(&[0]), None);
}

#[test]
fn a_response_frame_encoded_in_place_is_the_frame_encoded_apart() {
    let response = Response::Error(CqlError::overloaded("busy".to_string()));
    let mut in_place = b"earlier answers".to_vec();
    encode_frame(&mut in_place, 7, &response, false);
    let (op, body) = response.encode();
    let mut apart = b"earlier answers".to_vec();
    frame::write_frame(&mut apart, 7, op, &body, false);
    assert_eq!(in_place, apart);
}
