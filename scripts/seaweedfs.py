# SPDX-License-Identifier: Apache-2.0
"""A SeaweedFS S3 server on 127.0.0.1 for the S3 benchmark and example:
`weed server` (master, volume server, filer, S3 gateway in one process) on
free ports, its data in a temp dir, SigV4 checked against one identity,
killed (SIGKILL: it ignores SIGTERM for seconds) on exit. `weed` comes from
scripts/install-seaweedfs.sh (run here if needed).

    with SeaweedFS() as s3:
        s3.url("prefix")   # s3://ACCESS:SECRET@kvf/prefix?endpoint=...
"""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ACCESS, SECRET = "kvfaccess", "kvfsecret"
HERE = os.path.dirname(os.path.abspath(__file__))


def _free_base(n=8):
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


class SeaweedFS:
    def __init__(self, bucket="kvf"):
        self.bucket = bucket
        self.weed = subprocess.run(["sh", os.path.join(HERE, "install-seaweedfs.sh")], check=True,
                                   capture_output=True, text=True).stdout.strip()

    def __enter__(self):
        for attempt in range(3):  # a port taken between the check and the start: again
            try:
                return self._start()
            except RuntimeError:
                self.__exit__()
                if attempt == 2:
                    raise

    def _start(self):
        self.dir = tempfile.mkdtemp(prefix="kvferry-seaweedfs-")
        cfg = os.path.join(self.dir, "s3.json")
        with open(cfg, "w") as f:
            json.dump({"identities": [{"name": "kvf", "credentials": [
                {"accessKey": ACCESS, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "Write", "List"]}]}, f)
        b = _free_base()
        self.port = b
        self.endpoint = f"http://127.0.0.1:{b}"
        self.log = open(os.path.join(self.dir, "weed.log"), "w")
        self.proc = subprocess.Popen(
            [self.weed, "server", f"-dir={self.dir}", "-s3", f"-s3.port={b}", f"-master.port={b + 1}",
             f"-volume.port={b + 2}", f"-filer.port={b + 3}", f"-s3.port.grpc={b + 4}",
             f"-master.port.grpc={b + 5}", f"-volume.port.grpc={b + 6}", f"-filer.port.grpc={b + 7}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={cfg}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", "-volume.max=100", "-master.volumeSizeLimitMB=1024"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                with open(self.log.name) as f:
                    last = f.read().strip().splitlines()[-1:]
                raise RuntimeError(f"weed server exited: {last}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                break  # an answer (403): the gateway is up
            except OSError:
                pass
            if time.time() - t0 > 60:
                raise RuntimeError("weed server not up in 60 s")
            time.sleep(0.2)
        self._bucket()
        return self

    def _bucket(self):
        """The bucket, made through the filer (a directory under /buckets),
        and a first object written there: a volume is allocated and the
        store's first put finds it ready. No S3 client needed."""
        filer = f"http://127.0.0.1:{self.port + 3}/buckets/{self.bucket}"
        t0 = time.time()
        made = False
        while True:
            try:
                if not made:
                    try:
                        urllib.request.urlopen(urllib.request.Request(f"{filer}/?op=mkdir", method="POST"),
                                               timeout=5)
                    except urllib.error.HTTPError as exc:
                        # 409: made by an earlier try whose first object then
                        # failed (no volume yet): the bucket is there
                        if exc.code != 409:
                            raise
                    made = True
                urllib.request.urlopen(urllib.request.Request(f"{filer}/ready", data=b"ready",
                                                              method="PUT"), timeout=5)
                return
            except OSError:
                if time.time() - t0 > 60:
                    raise
                time.sleep(0.5)

    def boto3(self, **kw):
        """A boto3 client with the server's keys (boto3 installed)."""
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS,
                            aws_secret_access_key=SECRET, region_name="us-east-1",
                            config=Config(max_pool_connections=kw.get("conns", 16),
                                          retries={"max_attempts": 3}))

    def url(self, prefix="", conns=16):
        return (f"s3://{ACCESS}:{SECRET}@{self.bucket}/{prefix}?endpoint={self.endpoint}"
                f"&region=us-east-1&conns={conns}")

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir])
