//! Criterion benches of the output parsers (smg-parsers): a model's answer fed as decoded
//! token pieces, per family, and the cost per token. Pieces are 4 bytes (at character
//! boundaries), about what an English token decodes to. Each answer is some prose, then the
//! family's markup (a think block, or a tool call, as `smg_parsers::markup` writes it), then a
//! little more prose: the common case
//! (text that is not markup) and the markup both count. Budget (issue 26): at most 100 ns per
//! token on the 2-core box.
//!
//! Run: `cargo bench --bench parsers`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use smg_parsers::{markup, Parsed, Tool, ToolParser, Tools};

const PROSE: &str = "The weather in Paris is usually mild in spring, with rain showers and sunny spells; \
     pack a light coat and an umbrella, and check the forecast before you go out. ";

fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + 4).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn tools() -> Tools {
    Tools::new(vec![Tool {
        name: "get_weather".into(),
        params: vec![("city".into(), "string".into()), ("days".into(), "integer".into())],
    }])
}

/// get_weather(city="Paris", days=3).
const ARGS: &[(&str, &str)] = &[("city", "\"Paris\""), ("days", "3")];

/// The pieces through a parser, then its finish: how many calls it gave.
fn feed(mut p: Box<dyn ToolParser>, ps: &[&str], out: &mut Parsed) -> usize {
    let mut calls = 0;
    for piece in ps {
        out.clear();
        p.push(piece, out);
        calls += out.calls.len();
    }
    out.clear();
    p.finish(out);
    calls + out.calls.len()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("parsers");
    let mut out = Parsed::default();
    // Each tool family's markup after some prose (or alone, for the families whose whole answer
    // is the call), then gpt-oss's Harmony channels: reasoning on analysis, then a call on
    // commentary (the text the gateway decodes with special tokens kept).
    type Make = Box<dyn Fn(Tools) -> Box<dyn ToolParser>>;
    let mut cases: Vec<(String, String, Make)> = smg_parsers::tools::NAMES
        .iter()
        .map(|&name| {
            let call = markup::call(name, "get_weather", ARGS, 0).unwrap();
            let text = if markup::stands_alone(name) { call } else { format!("{}{call}{}", PROSE.repeat(3), PROSE) };
            let make: Make = Box::new(move |t| smg_parsers::tools::by_name(name, t).unwrap());
            (format!("tools/{name}"), text, make)
        })
        .collect();
    let harmony = format!(
        "<|channel|>analysis<|message|>{}<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{\"city\":\"Paris\",\"days\":3}}<|call|>",
        PROSE.repeat(4)
    );
    cases.push(("harmony".into(), harmony, Box::new(smg_parsers::harmony::parser)));
    for (label, text, make) in &cases {
        let ps = pieces(text);
        // The markup must be read as a call, or the bench measures the wrong path.
        assert_eq!(feed(make(tools()), &ps, &mut out), 1, "{label}: the call was not parsed from {text:?}");
        g.throughput(Throughput::Elements(ps.len() as u64));
        // The request's tools are read once; each choice's parser holds a clone (a count).
        let offered = tools();
        g.bench_function(label.as_str(), |b| b.iter(|| feed(make(offered.clone()), black_box(&ps), &mut out)));
    }
    for &name in smg_parsers::reasoning::NAMES {
        let Some(text) = markup::reasoning(name, &PROSE.repeat(3), PROSE) else { continue };
        let ps = pieces(&text);
        g.throughput(Throughput::Elements(ps.len() as u64));
        g.bench_function(format!("reasoning/{name}"), |b| {
            b.iter(|| {
                let mut p = smg_parsers::reasoning::by_name(name, true).unwrap();
                let mut n = 0;
                for piece in &ps {
                    out.clear();
                    p.push(black_box(piece), &mut out);
                    n += out.reasoning.len();
                }
                out.clear();
                p.finish(&mut out);
                n
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
