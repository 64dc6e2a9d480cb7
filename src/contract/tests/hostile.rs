//! Hostile input: deep nesting, huge values, bad UTF-8, duplicate keys, non-JSON numbers.

use super::super::{inspect, json, Aliases, ContractError, Endpoint};

fn check(body: &[u8]) -> Result<(), ContractError> {
    inspect(Endpoint::ChatCompletions, body, true, &Aliases::default()).map(|_| ())
}

fn with(extra: &str) -> Vec<u8> {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#).into_bytes()
}

fn parse_error_containing(body: &[u8], needle: &str) {
    match check(body) {
        Err(ContractError::JsonParse(m)) => assert!(m.contains(needle), "{m} lacks {needle}"),
        other => panic!("expected json_parse_error with {needle}, got {other:?}"),
    }
}

#[test]
fn deep_nesting_is_capped_without_recursion() {
    // Depth 128 in total (the root object counts) is fine; one more is not.
    let ok = format!(r#","x":{}{}"#, "[".repeat(127), "]".repeat(127));
    assert!(check(&with(&ok)).is_ok());
    let deep = format!(r#","x":{}{}"#, "[".repeat(128), "]".repeat(128));
    parse_error_containing(&with(&deep), "recursion limit exceeded");
    // A million open brackets: rejected at the cap, no stack growth.
    let huge = format!(r#","x":{}"#, "[{\"a\":".repeat(500_000));
    parse_error_containing(&with(&huge), "recursion limit exceeded");
}

#[test]
fn huge_strings_and_arrays_are_fine() {
    let big = "a".repeat(8 << 20);
    assert!(check(&with(&format!(r#","x":"{big}""#))).is_ok());
    let many = vec!["1.5"; 500_000].join(",");
    assert!(check(&with(&format!(r#","x":[{many}]"#))).is_ok());
    let msgs = vec![r#"{"role":"user","content":"hi"}"#; 50_000].join(",");
    assert!(check(format!(r#"{{"model":"m","messages":[{msgs}]}}"#).as_bytes()).is_ok());
    // The tape never has more entries than the body has bytes.
    let body = with(&format!(r#","x":[{many}]"#));
    let doc = json::parse(&body).unwrap();
    assert!(doc.nodes.len() <= body.len());
}

#[test]
fn invalid_utf8_is_a_parse_error() {
    let mut body = with(r#","user":"ab""#);
    let at = body.iter().position(|&b| b == b'b').unwrap();
    body[at] = 0xff;
    parse_error_containing(&body, "invalid UTF-8");
    let mut body = with("");
    body.splice(20..20, [0xc3]);
    parse_error_containing(&body, "invalid UTF-8");
}

#[test]
fn duplicate_keys_are_rejected_even_when_escaped() {
    parse_error_containing(br#"{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}"#, "duplicate key");
    parse_error_containing(
        br#"{"model":"a","mod\u0065l":"b","messages":[{"role":"user","content":"x"}]}"#,
        "duplicate key",
    );
    parse_error_containing(
        br#"{"model":"a","messages":[{"role":"user","role":"root","content":"x"}]}"#,
        "duplicate key",
    );
    let wide: String = (0..100).map(|i| format!(r#""k{i}":{i},"#)).collect();
    parse_error_containing(&with(&format!(r#","x":{{{wide}"k7":0}}"#)), "duplicate key");
    assert!(check(&with(&format!(r#","x":{{{wide}"k100":0}}"#))).is_ok());
}

#[test]
fn non_json_tokens_are_parse_errors() {
    for bad in [
        r#","temperature":NaN"#,
        r#","temperature":Infinity"#,
        r#","temperature":-Infinity"#,
        r#","temperature":1e999"#,
        r#","temperature":01"#,
        r#","temperature":1."#,
        r#","temperature":.5"#,
        r#","temperature":+1"#,
        r#","temperature":0x10"#,
        r#","x":[1,]"#,
        r#","x":{"a":1,}"#,
        r#","x":'single'"#,
        r#","x":"lone \ud800 surrogate""#,
        r#","x":"trailing \udc00 surrogate""#,
        r#","x":"bad \q escape""#,
        r#","x":"tab	inside""#,
        r#","x":tru"#,
        r#","x":nul"#,
        ",",
    ] {
        let body = with(bad);
        assert!(matches!(check(&body), Err(ContractError::JsonParse(_))), "{bad}");
    }
    for bad in ["", " ", "{", "}", "[", "\"x", "{\"model\"}", "{\"model\":}", "nul", "{} {}"] {
        assert!(matches!(check(bad.as_bytes()), Err(ContractError::JsonParse(_))), "{bad:?}");
    }
    // Valid escapes and a surrogate pair are fine.
    assert!(check(&with(r#","x":"\" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00""#)).is_ok());
    assert!(check(&with(r#","temperature":1E0,"top_p":5e-1,"seed":-0"#)).is_ok());
}

#[test]
fn scanner_agrees_with_sonic_rs() {
    let docs = [
        "{}",
        "[]",
        "0",
        "-0",
        "1.5e+3",
        "\"a\\u0041\"",
        "[1,[2,[3]]]",
        "{\"a\":{\"b\":[null,true,false]}}",
        "[1 , 2 ]",
        " [ ] ",
        "[01]",
        "[1.]",
        "[-]",
        "[\"\\x\"]",
        "[\"a\nb\"]",
        "{\"a\" 1}",
        "[1 2]",
        "[\"\\ud800\\udc00\"]",
        "[1e-5]",
        "[0.0e0]",
        "tru",
        "[true false]",
        "{\"a\":1,\"b\"}",
        "[,1]",
        "\u{feff}[]",
    ];
    for d in docs {
        let ours = json::parse(d.as_bytes()).is_ok();
        let sonic = sonic_rs::from_slice::<sonic_rs::Value>(d.as_bytes()).is_ok();
        assert_eq!(ours, sonic, "{d:?}");
    }
}

#[test]
fn error_messages_are_bounded() {
    let long = "x".repeat(1 << 20);
    let err =
        check(format!(r#"{{"model":"m","messages":[{{"role":"{long}","content":"a"}}]}}"#).as_bytes()).unwrap_err();
    assert!(err.body().len() < 512, "{}", err.body().len());
    let err = check(&with(&format!(r#","n":{}"#, "9".repeat(200)))).unwrap_err();
    assert!(err.body().len() < 512);
}
