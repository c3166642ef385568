#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the fuzzers' seed corpora (tests/fuzz/corpus/NAME/) from the messages and files the
real programs exchange, built here the way they build them:

  agent_requests  a rank's session with solar-agent (client/src/client.cpp: hello, next, release;
                  solar stat's stats request; an interposer's xhello and xfetch; shutdown),
                  laid out as in protocol/include/solar/protocol.h; the first byte picks the
                  fuzzer's read size
  stored_wire     FabricSource's messages to solar-stored and the server's hello reply
                  (storage/src/fabric_source.cpp, server.cpp), framed as in wire.h, then the
                  24 bytes the fuzzer reads its dataset (samples, sample bytes) and staging
                  buffer size from
  spank_settings  the plugstack.conf line of slurm_examples/README.md, --solar-* options and
                  SOLAR_* variables as a user gives them, and `solar dataset-info`'s JSON line
  report          solar-run-stats-out.json is a real `solar run --stats-out` file (2 nodes,
                  2 epochs; committed as written, not made here); from it one agent's
                  --stats-out file, and a bench/pytorch_io.py --json result and a bench/sweep
                  result with their fields

Run it from anywhere: /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC, VERSION = 0x524C4F53, 8  # solar/protocol.h kVersion
HELLO, NEXT, RELEASE, STATS, SHUTDOWN, XHELLO, XFETCH = 1, 3, 6, 7, 9, 11, 13


def write(corpus, name, data):
    folder = os.path.join(HERE, "corpus", corpus)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def frame(op, body=b""):
    return struct.pack("<IHHII", MAGIC, VERSION, op, len(body), 0) + body


def agent_requests():
    hello = frame(HELLO, struct.pack("<II", 0, 4242))
    session = hello + frame(NEXT, struct.pack("<Q", 0))
    for step in range(1, 4):  # libsolar sends a release with the next request
        session += frame(RELEASE, struct.pack("<Q", step - 1)) + frame(NEXT, struct.pack("<Q", step))
    session += frame(RELEASE, struct.pack("<Q", 3))
    write("agent_requests", "rank-session", b"\x00" + session)
    write("agent_requests", "rank-session-bytewise", b"\x01" + session)
    write("agent_requests", "rank-session-7", b"\x07" + session)
    write("agent_requests", "stats", b"\x00" + frame(STATS))
    write("agent_requests", "xhello", b"\x00" + frame(XHELLO, struct.pack("<II", 4243, 0)))
    write("agent_requests", "xfetch", b"\x00" + frame(XFETCH, struct.pack("<II", 17, 0)))
    write("agent_requests", "shutdown", b"\x00" + frame(SHUTDOWN))
    # An oversized hello, as a stranger might send: refused on its header.
    write("agent_requests", "oversized", b"\x00" + struct.pack("<IHHII", MAGIC, VERSION, HELLO,
                                                              1 << 20, 0))


def stored_wire():
    def msg(j, samples=200, sample_bytes=4096, staging=64 << 20):
        body = json.dumps(j, separators=(",", ":")).encode()
        return struct.pack("<I", len(body)) + body + struct.pack("<QQQ", samples, sample_bytes,
                                                                 staging)
    write("stored_wire", "hello", msg({"op": "hello", "version": 2, "token": "s3cret",
                                       "dataset": "train"}))
    write("stored_wire", "stage", msg({"op": "stage", "runs": [[0, 4], [10, 1], [100, 28]]}))
    write("stored_wire", "stage-big", msg({"op": "stage", "runs": [[0, 200], [0, 200]]},
                                          samples=1 << 40, sample_bytes=1 << 20))
    write("stored_wire", "done", msg({"op": "done"}))
    write("stored_wire", "drop_cache", msg({"op": "drop_cache"}))
    write("stored_wire", "bye", msg({"op": "bye"}))
    info = {"samples": 200, "shape": [4, 8, 8, 8], "dtype": "int16", "sample_bytes": 4096,
            "has_labels": True, "label_dtype": "int32", "label_bytes": 4, "layout": "contiguous",
            "seed": 0}
    write("stored_wire", "hello-reply", msg({
        "ok": True, "provider": "tcp", "address": "0200a4b57f000001" + "00" * 8,
        "virt_addr": True, "info": info,
        "identity": "file inode 10953109 size 822048 mtime 1796081512.243380549",
        "throttle": {"bandwidth": 0, "latency_s": 0},
        "data": {"mode": "rma", "key": 1234567, "base": 0},
        "labels": {"key": 7654321, "base": 0}}))
    write("stored_wire", "refusal", msg({"ok": False, "retry": True,
                                         "error": "server busy: every staging buffer is in use"}))


def spank_settings():
    plugin = "/usr/lib/slurm-wlm/solar_spank.so"
    dataset_info = json.dumps({"dtype": "int16", "identity": "file inode 10953109 size 822048 "
                               "mtime 1796081512.243380549", "label_bytes": 4,
                               "layout": "contiguous", "sample_bytes": 4096, "samples": 200,
                               "shape": "4x8x8x8"}, separators=(",", ":"))
    write("spank_settings", "readme", "\n".join([
        plugin, "plan_dir=/lus/scratch/solar-plans max_buffer=50%",
        "dataset=/lus/data/train.h5:/data", "buffer=40%", "epochs=3", "batch=8", "seed=7",
        "order=torch", "imbalance=1", "verbose=", "stats=/home/u/stats-%j.%s.json",
        dataset_info]) + "\n")
    write("spank_settings", "every-key", "\n".join([
        plugin, "agent=/opt/solar/bin/solar-agent solar=/opt/solar/bin/solar plan_dir=/tmp/ "
        "runtime_dir=/run/solar max_buffer=64G provider=tcp on_error=fail timeout=30 "
        "zero_copy=yes transparent=no preload=/opt/solar/lib/libsolar_preload.so",
        "SOLAR_DATASET=fabric://store:7000/train", "SOLAR_BUFFER=2G", "SOLAR_EPOCHS=2",
        "SOLAR_BATCH=16", "transparent=", dataset_info]) + "\n")
    write("spank_settings", "off", "\n".join(["", "", "=off", "SOLAR_DATASET=/d.h5", ""]))


def report():
    folder = os.path.join(HERE, "corpus", "report")
    with open(os.path.join(folder, "solar-run-stats-out.json")) as f:
        run = json.load(f)
    write("report", "agent-stats-out.json", json.dumps(run["nodes"][0], indent=1))
    write("report", "pytorch-io.json", json.dumps({
        "config": {"samples": 200, "nodes": 2, "ranks": 2, "batch": 8, "epochs": 3},
        "modes": {"baseline": {"per_epoch_s": [1.0, 0.98, 1.01], "total_s": 2.99,
                               "num_workers": 4},
                  "solar": {"per_epoch_s": [0.6, 0.45, 0.5], "total_s": 1.55, "speedup": 1.88,
                            "limit": 4.0, "of_limit": 0.47},
                  "transparent": {"per_epoch_s": [0.7, 0.5, 0.5], "total_s": 1.7,
                                  "speedup": 1.76}}}, indent=1))
    write("report", "sweep.json", json.dumps({"points": [
        {"label": "bandwidth 2n 3e 26%", "speedup": 1.4, "limit": 1.6, "of_limit": 0.87},
        {"label": "iops 1n 3e 64%", "speedup": 2.1, "limit": 2.6, "of_limit": 0.81}],
        "command": "bench/sweep --quick"}, indent=1))


if __name__ == "__main__":
    agent_requests()
    stored_wire()
    spank_settings()
    report()
