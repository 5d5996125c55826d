# SPDX-License-Identifier: Apache-2.0
"""Runs bench/remote_arrival (build/bench/remote_arrival) for each remote
pool group size against a loopback redis-server and a SeaweedFS S3 server
of its own (scripts/seaweedfs.py), printing the raw runs: what the remote
tier's default group size (src/engine/arrival.c) is chosen from.

    python3 scripts/remote-groups-bench.py [build/bench/remote_arrival] [blocks] [runs]
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from seaweedfs import SeaweedFS  # noqa: E402

SIZES = os.environ.get("SIZES", "1 65536 262144 1048576 4194304").split()
TOKENS = os.environ.get("TOKENS", "16")  # a block's tokens: 16, 2 MiB blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sizes(bench, url, blocks, runs):
    for size in SIZES:
        env = dict(os.environ, KVF_REMOTE_GROUP_BYTES=size)
        out = subprocess.run([bench, url, str(blocks), str(runs), TOKENS], env=env, capture_output=True,
                             text=True, timeout=600)
        sys.stdout.write(out.stdout)
        if out.returncode:
            sys.stdout.write(out.stderr)
            raise SystemExit(f"remote_arrival failed for {size}")
        sys.stdout.flush()


def main():
    bench = sys.argv[1] if len(sys.argv) > 1 else "build/bench/remote_arrival"
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    print(f"remote-groups-bench: {os.uname().nodename}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if shutil.which("redis-server") and os.environ.get("STORES", "redis s3").find("redis") >= 0:
        d = tempfile.mkdtemp(prefix="kvferry-groups-redis-")
        port = free_port()
        srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                                "--save", "", "--appendonly", "no", "--logfile", "redis.log"])
        try:
            for _ in range(400):
                if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                  text=True).stdout.strip() == "PONG":
                    break
                time.sleep(0.05)
            ver = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
            print(f"---- redis loopback ({' '.join(ver.split()[:3])})")
            run_sizes(bench, f"redis://127.0.0.1:{port}", blocks, runs)
        finally:
            srv.kill()
            srv.wait()
            shutil.rmtree(d, ignore_errors=True)
    if os.environ.get("STORES", "redis s3").find("s3") < 0:
        return
    with SeaweedFS() as s3:
        print("---- SeaweedFS S3 loopback")
        run_sizes(bench, s3.url("groups"), blocks, runs)


if __name__ == "__main__":
    main()
