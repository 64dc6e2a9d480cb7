#!/usr/bin/env python3
"""Gateway memory: idle RSS with 4 shards, then RSS holding 10,000 idle keep-alive clients.

Run from the repository root after `cargo build --release --workspace`; pass any argument
to use the epoll driver. Everything runs on 127.0.0.1 and stops by itself."""
import socket, subprocess, time, os, sys, resource
h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) / 1024
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
simp, gwp = port(), port()
env = dict(os.environ)
if len(sys.argv) > 1: env["MONOIO_FORCE_LEGACY_DRIVER"] = "1"
sim = subprocess.Popen(["./target/release/smg-sim", "--ports", str(simp)], stdout=subprocess.DEVNULL, env=env)
time.sleep(0.5)
gw = subprocess.Popen(["./target/release/smg", "launch", "--host", "127.0.0.1", "--port", str(gwp), "--cores", "4",
                       "--worker-urls", f"http://127.0.0.1:{simp}"], stderr=subprocess.DEVNULL, env=env)
time.sleep(1.5)
print(f"idle RSS, 4 shards: {rss(gw.pid):.1f} MB")
conns = []
req = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
for i in range(10000):
    s = socket.create_connection(("127.0.0.1", gwp)); s.sendall(req); conns.append(s)
for s in conns:
    s.recv(4096)
time.sleep(1)
print(f"RSS with 10,000 idle keep-alive clients (each served once), 4 shards: {rss(gw.pid):.1f} MB")
gw.terminate(); sim.terminate(); gw.wait(); sim.wait()
