#!/usr/bin/env python3
"""Writes the synthetic sample traces in this folder (seeded, so reruns give the same files).

Neither file is taken from the public traces: the shapes only follow their formats.
  azure-sample.csv     Azure LLM inference CSV: TIMESTAMP,ContextTokens,GeneratedTokens
  mooncake-sample.jsonl Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids
                        (512-token blocks); multi-turn sessions extend their own history and
                        share a two-block system prompt, so prefixes repeat.
"""
import datetime, json, random

N = 300
rng = random.Random(20231116)

# Azure: Poisson arrivals, mean gap 10 ms; lognormal lengths.
t = datetime.datetime(2023, 11, 16, 18, 15, 46, 680590)
with open("azure-sample.csv", "w") as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for _ in range(N):
        ctx = min(8000, max(16, int(rng.lognormvariate(6.3, 0.9))))
        gen = min(1000, max(1, int(rng.lognormvariate(4.2, 0.8))))
        f.write(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{ctx},{gen}\n")
        t += datetime.timedelta(microseconds=int(rng.expovariate(1 / 10_000)))

# Mooncake: 40 sessions; each turn resends the session's history plus new blocks.
next_id = 2  # 0 and 1: the shared system prompt
sessions = {}
ts = 0.0
with open("mooncake-sample.jsonl", "w") as f:
    for _ in range(N):
        s = rng.randrange(40)
        hist = sessions.get(s, [0, 1])
        new = list(range(next_id, next_id + rng.randint(1, 3)))
        next_id += len(new)
        ids = hist + new
        # The last block is partial; its id is never reused, so the next turn starts a fresh one.
        inp = (len(ids) - 1) * 512 + rng.randint(16, 512)
        sessions[s] = ids[:-1]
        out = max(1, int(rng.lognormvariate(4.0, 0.7)))
        f.write(json.dumps({"timestamp": int(ts), "input_length": inp, "output_length": out, "hash_ids": ids}) + "\n")
        ts += rng.expovariate(1 / 10.0)
