fn main() {
    afl::fuzz!(|data: &[u8]| fuzz_targets::parsers(data));
}
