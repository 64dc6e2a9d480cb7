//! Every file of every seed corpus (`fuzz/corpus/<target>/`, with what fuzzing added to it)
//! through its target: a regression test of the parsers on the inputs that found their
//! paths, run by `cargo test` with no fuzzing time.

use std::path::Path;

#[test]
fn every_corpus_file_passes_its_target() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus");
    let mut dirs: Vec<String> = std::fs::read_dir(&corpus)
        .expect("fuzz/corpus")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    dirs.sort();
    let mut names: Vec<String> = fuzz_targets::TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(dirs, names, "one corpus directory per target");

    // The gateway parses outside bytes on threads with this stack (deep JSON recurses in
    // sonic-rs); a test thread's default 2 MiB is less.
    let run = std::thread::Builder::new().stack_size(smg::bounded_json::THREAD_STACK).spawn(move || {
        for (name, target) in fuzz_targets::TARGETS {
            let dir = corpus.join(name);
            let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
            files.sort();
            assert!(!files.is_empty(), "{name}: empty corpus");
            for f in &files {
                let data = std::fs::read(f).unwrap();
                eprintln!("{name}: {}", f.display());
                target(&data);
            }
        }
    });
    run.unwrap().join().expect("a corpus file made its target panic (the file is printed above)");
}
