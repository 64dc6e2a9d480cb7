//! `smg-load sweep` against smg-sim with a known capacity, and the `--report` page in a real
//! headless browser (Debian `chromium`; the browser test is skipped with a note when absent).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

/// A fresh scratch directory under this test profile's target directory (kept: the
/// screenshot is a CI artifact).
fn out_dir(name: &str) -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_smg-load"));
    let dir = exe.parent().unwrap().join("loadtest-report").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The sweep's knee is a timing measurement: it must not share the two cores with a browser.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"].iter().map(PathBuf::from).find(|p| p.is_file())
}

#[test]
fn sweep_finds_the_knee_of_a_known_capacity() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for legacy in DRIVERS {
        // 8 batch slots, ~22 ms per request (20 ms TTFT, one token, plus overhead): the
        // simulator serves 8 / 0.022 ≈ 360 req/s; 8 / 0.020 = 400 req/s is the ceiling. The
        // rates double from 120: the last one under capacity (240) loads the slots to about
        // two thirds, so a busy host's scheduling delays stay far inside the 150 ms SLO; the
        // first past it (480) offers 1.2x the ceiling, so the queue outgrows the SLO within a
        // fraction of a second whatever the host does.
        let dir = out_dir(if legacy { "sweep-epoll" } else { "sweep-uring" });
        let s = smg_load(
            &[
                "sweep",
                "--targets",
                "direct",
                "--sim-bin",
                env!("CARGO_BIN_EXE_smg-sim"),
                "--sim-args",
                "--max-running 8 --ttft-ms 20 --output-tokens 1",
                "--search",
                "120,2",
                "--max-steps",
                "6",
                "--slo",
                "e2e=150ms",
                "--duration",
                "2s",
                "--warmup",
                "300ms",
                "--report",
                dir.to_str().unwrap(),
                "--json",
            ],
            legacy,
        );
        let cap = &s["capacity"][0];
        let knee = cap["rps"].as_f64().unwrap();
        let miss = cap["first_miss_rps"].as_f64().unwrap();
        // Rates 120, 240, 480: the knee is within one step below 400 and the first miss within
        // one step above it.
        assert!((400.0 / 2.0..=400.0).contains(&knee), "knee {knee}: {s:?}");
        assert!((400.0..=800.0).contains(&miss), "first miss {miss}");
        let entries = s["entries"].as_array().unwrap();
        // The search stops one step past the knee.
        assert_eq!(entries.last().unwrap()["offered_rps"].as_f64(), Some(miss));
        for e in entries.iter() {
            let rate = e["offered_rps"].as_f64().unwrap();
            let frac = e["goodput"]["fraction"].as_f64().unwrap();
            let served = e["report"]["rps"].as_f64().unwrap();
            if rate <= knee {
                assert!(frac >= 0.99, "{rate}: {frac}");
            } else {
                // Past capacity the queue grows for the whole run: most requests miss 150 ms,
                // and the simulator serves no more than its ceiling.
                assert!(frac < 0.5, "{rate}: goodput {frac}");
                assert!(served < 420.0, "{rate}: served {served}");
            }
        }
        let csv = std::fs::read_to_string(dir.join("records.csv")).unwrap();
        let rows = csv.lines().count() - 1;
        let total: u64 = entries.iter().map(|e| e["report"]["requests"].as_u64().unwrap()).sum();
        assert_eq!(rows as u64, total);
        assert!(csv.starts_with("target,offered_rps,start_us,latency_us"));
        assert!(dir.join("summary.json").is_file() && dir.join("report.html").is_file());
    }
}

/// Loads `page` in headless chromium: the dumped DOM, and whether stderr carried a console error.
fn open_in_browser(chrome: &Path, page: &Path, shot: &Path) -> (String, String) {
    let url = format!("file://{}", page.display());
    let dom = Command::new(chrome)
        .args(["--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0", "--dump-dom", &url])
        .output()
        .expect("run chromium");
    assert!(dom.status.success(), "chromium --dump-dom: {}", String::from_utf8_lossy(&dom.stderr));
    let shot_arg = format!("--screenshot={}", shot.display());
    let s = Command::new(chrome)
        .args(["--headless", "--disable-gpu", "--no-sandbox", &shot_arg, "--window-size=1280,2000", &url])
        .output()
        .expect("run chromium");
    assert!(s.status.success(), "chromium --screenshot: {}", String::from_utf8_lossy(&s.stderr));
    (String::from_utf8_lossy(&dom.stdout).into_owned(), String::from_utf8_lossy(&dom.stderr).into_owned())
}

/// Checks one page: the inline script ran, every chart has a line, no console error.
fn check_page(chrome: &Path, dir: &Path, min_charts: usize) -> String {
    let shot = dir.join("report.png");
    let (dom, stderr) = open_in_browser(chrome, &dir.join("report.html"), &shot);
    // The inline script ran to the end and found charts with lines in them.
    assert!(dom.contains("data-rendered=\"ok\""), "{}", &dom[..dom.len().min(2000)]);
    let svgs = dom.matches("<svg class=\"chart\"").count();
    assert!(svgs >= min_charts, "{svgs} charts in {}", dir.display());
    for chunk in dom.split("<svg class=\"chart\"").skip(1) {
        let svg = &chunk[..chunk.find("</svg>").unwrap()];
        assert!(svg.contains("<polyline points=\""), "an empty chart: {}", &svg[..svg.len().min(400)]);
    }
    for line in stderr.lines() {
        assert!(!line.contains("Uncaught") && !line.contains("ERROR:CONSOLE"), "console error: {line}");
    }
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000, "screenshot {}", shot.display());
    dom
}

#[test]
fn report_pages_render_in_a_headless_browser() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(chrome) = chromium() else {
        eprintln!("note: chromium not installed (apt-get install -y chromium): browser check skipped");
        return;
    };
    let sim_args = "--ttft-ms 2 --itl-ms 1 --fail-rate 0.2";
    // A run page: one entry, so only the distributions and the time line.
    let sim = Sim::start(&["--ports", "0", "--ttft-ms", "2", "--itl-ms", "1", "--fail-rate", "0.2"], false);
    let run_dir = out_dir("run-sse");
    let r = smg_load(
        &[
            "run",
            "--url",
            &format!("http://127.0.0.1:{}", sim.port()),
            "--scenario",
            "sse-long",
            "--rate",
            "50",
            "--duration",
            "1s",
            "--report",
            run_dir.to_str().unwrap(),
            "--json",
        ],
        false,
    );
    assert!(r["errors"].as_u64().unwrap() > 0, "{r:?}");
    // TTFT, ITL and e2e distributions; completions and errors over time.
    let dom = check_page(&chrome, &run_dir, 4);
    assert!(dom.contains("status 500"), "errors table");
    // A sweep page over two targets (the simulator by name and by URL): every chart kind.
    let sweep_dir = out_dir("sweep-sse");
    let url = format!("http://127.0.0.1:{}", sim.port());
    smg_load(
        &[
            "sweep",
            "--targets",
            &format!("direct,{url}"),
            "--sim-bin",
            env!("CARGO_BIN_EXE_smg-sim"),
            "--sim-args",
            sim_args,
            "--scenario",
            "sse-long",
            "--rates",
            "20,40",
            "--slo",
            "ttft=50ms,itl=5ms,e2e=2s",
            "--duration",
            "700ms",
            "--warmup",
            "200ms",
            "--report",
            sweep_dir.to_str().unwrap(),
            "--json",
        ],
        false,
    );
    // Percentiles of e2e, TTFT, ITL; throughput and goodput; three distributions; time line.
    let dom = check_page(&chrome, &sweep_dir, 8);
    assert!(dom.contains("SLO ttft"), "SLO line");
}
