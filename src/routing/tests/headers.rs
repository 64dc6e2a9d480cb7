//! Header edge cases from the contract: routing tokens, routing keys, target worker, rid lineage.

use crate::routing::{
    first_routing_key, parse_routing_tokens, parse_target_worker, rid_key, sticky_rid, valid_routing_key,
};

#[test]
fn routing_tokens_accepts_the_documented_form() {
    assert_eq!(parse_routing_tokens(b"128000,791,4062,14198,39935"), Some(vec![128000, 791, 4062, 14198, 39935]));
    assert_eq!(parse_routing_tokens(b"0"), Some(vec![0]));
    assert_eq!(parse_routing_tokens(b"0,4294967295"), Some(vec![0, u32::MAX]));
    // Leading zeros are still decimal integers.
    assert_eq!(parse_routing_tokens(b"007"), Some(vec![7]));
    // The field's framing whitespace is not part of the value.
    assert_eq!(parse_routing_tokens(b" 1,2\t"), Some(vec![1, 2]));
}

#[test]
fn routing_tokens_rejects_malformed_hints() {
    for bad in [
        &b""[..],
        b" ",
        b"1, 2",
        b"1 ,2",
        b"+1",
        b"-1",
        b"1,,2",
        b"1,",
        b",1",
        b",",
        b"4294967296",
        b"99999999999999999999",
        b"1a",
        b"0x10",
        b"1.5",
        b"1;2",
        "\u{661}".as_bytes(), // Arabic-Indic digit one
    ] {
        assert_eq!(parse_routing_tokens(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn routing_tokens_limits_ids_and_bytes() {
    let ids = |n: usize, v: &str| vec![v; n].join(",");
    assert_eq!(parse_routing_tokens(ids(512, "1").as_bytes()).map(|v| v.len()), Some(512));
    assert_eq!(parse_routing_tokens(ids(513, "1").as_bytes()), None);
    // 512 ids can exceed 4096 bytes: the byte limit holds on its own.
    let long = ids(512, "4294967295");
    assert!(long.len() > 4096);
    assert_eq!(parse_routing_tokens(long.as_bytes()), None);
    // Exactly 4096 bytes is allowed, one more byte is not.
    let mut exact = ids(409, "123456789");
    exact.push_str(",123456");
    assert_eq!(exact.len(), 4096);
    assert_eq!(parse_routing_tokens(exact.as_bytes()).map(|v| v.len()), Some(410));
    exact.push('7');
    assert_eq!(parse_routing_tokens(exact.as_bytes()), None);
}

#[test]
fn routing_key_is_non_empty_utf8_up_to_128_bytes() {
    assert_eq!(valid_routing_key(b"user-1"), Some("user-1"));
    assert_eq!(valid_routing_key(b""), None);
    assert_eq!(valid_routing_key(b"  "), None);
    let k128 = "k".repeat(128);
    assert_eq!(valid_routing_key(k128.as_bytes()), Some(k128.as_str()));
    assert_eq!(valid_routing_key("k".repeat(129).as_bytes()), None);
    // 64 two-byte characters: 128 bytes, fine; one more is over.
    let e = "é".repeat(64);
    assert_eq!(valid_routing_key(e.as_bytes()), Some(e.as_str()));
    assert_eq!(valid_routing_key("é".repeat(65).as_bytes()), None);
    assert_eq!(valid_routing_key(b"\xff\xfe"), None);
}

#[test]
fn first_routing_key_skips_invalid_values_in_order() {
    let names = vec!["x-routing-key".to_string(), "x-smg-routing-key".to_string()];
    let headers = [("x-routing-key", &b""[..]), ("x-smg-routing-key", &b"conv"[..])];
    let get = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
    assert_eq!(first_routing_key(&names, get), Some("conv"));
    let headers = [("x-routing-key", &b"first"[..]), ("x-smg-routing-key", &b"second"[..])];
    let get = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
    assert_eq!(first_routing_key(&names, get), Some("first"));
    assert_eq!(first_routing_key(&names, |_| None), None);
}

#[test]
fn rid_lineage_table_from_the_docs() {
    for (rid, key) in [
        ("conv", "conv"),
        ("conv_t2", "conv"),
        ("conv_t2_r1", "conv"),
        ("conv_r1", "conv"),
        ("conv_t1_t2", "conv_t1"),
        ("conv_r1_t2", "conv_r1"),
        ("conv_t", "conv_t"),
        ("conv_tx1", "conv_tx1"),
        ("conv_T2", "conv_T2"),
        ("under_scored_id", "under_scored_id"),
        ("_t1", "_t1"),
        ("_t1_r2", "_t1_r2"),
        ("a_r10", "a"),
        ("chat-7f3a_t2_r1", "chat-7f3a"),
    ] {
        assert_eq!(sticky_rid(rid), key, "{rid}");
    }
}

#[test]
fn rid_key_falls_back_when_too_long_or_empty() {
    assert_eq!(rid_key("conv_t3"), Some("conv"));
    let long = format!("{}_t1", "a".repeat(128));
    assert_eq!(rid_key(&long), Some(&long[..128]));
    let too_long = format!("{}_t1", "a".repeat(129));
    assert_eq!(rid_key(&too_long), None);
    assert_eq!(rid_key(""), None);
}

#[test]
fn target_worker_is_a_plain_index() {
    assert_eq!(parse_target_worker("0"), Some(0));
    assert_eq!(parse_target_worker("12"), Some(12));
    assert_eq!(parse_target_worker(" 3 "), Some(3));
    for bad in ["", "-1", "+1", "1.0", "one", "99999999999999999999999"] {
        assert_eq!(parse_target_worker(bad), None, "{bad}");
    }
}
