"""A headless Chromium driven over the DevTools protocol, with the standard library alone.

Debian's `chromium --headless --remote-debugging-port=0` prints the browser's WebSocket URL on
stderr; this module starts it in a session of its own (so that only its own processes are ever
signalled), opens a page target, and speaks the protocol's JSON over a minimal WebSocket client
(RFC 6455: masked client frames, text/continuation frames, no extensions). Used by the
dashboard's test (tests/dashboard/test_dashboard.py) and its load-time measurement
(experiments/bench/dashboard_load.py).
"""
import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def wait_for_status_url(url_file, run, timeout=120):
    """The head's status URL once it has written `url_file` (runs/NAME/status.url); raises when
    `run` (the `xloco local` process) ends first or `timeout` passes."""
    deadline = time.time() + timeout
    while True:
        try:
            url = open(url_file).read().strip()
        except OSError:
            url = ""
        if url:
            return url
        if run.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the head never wrote {url_file}")
        time.sleep(0.2)


def stop_group(proc, grace=30):
    """SIGTERM to the process group `proc` leads (started with start_new_session=True), then
    SIGKILL to whatever of it is left after `grace` seconds; reaps `proc`. Only that group is
    ever signalled, and it is signalled even when `proc` itself has already exited."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace if sig == signal.SIGTERM else None)
            if sig == signal.SIGTERM:
                time.sleep(1)  # its children leave after it
        except subprocess.TimeoutExpired:
            pass
    proc.wait()


class WebSocket:
    def __init__(self, url, timeout=30):
        assert url.startswith("ws://"), url
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the WebSocket handshake")
            head += chunk
        status, _, rest = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n")[0]:
            raise ConnectionError(f"DevTools refused the WebSocket: {status[:200]!r}")
        self.buf = rest

    def send(self, text):
        data = text.encode()
        header = bytearray([0x81])
        n = len(data)
        if n < 126:
            header.append(0x80 | n)
        elif n < 65536:
            header.append(0x80 | 126)
            header += struct.pack(">H", n)
        else:
            header.append(0x80 | 127)
            header += struct.pack(">Q", n)
        mask = os.urandom(4)
        header += mask
        self.sock.sendall(bytes(header) + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools closed the WebSocket")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the WebSocket")
            if opcode in (0x9, 0xA):  # ping, pong: not used by DevTools
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Browser:
    """A headless Chromium with one page; `evaluate` runs JavaScript in it."""

    def __init__(self, chromium=None, width=1280, height=1000):
        self.chromium = chromium or find_chromium()
        if not self.chromium:
            raise FileNotFoundError("chromium is not installed (Debian package chromium)")
        self.profile = tempfile.mkdtemp(prefix="xloco-chromium-")
        self.stderr_path = os.path.join(self.profile, "stderr.log")
        args = [self.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-dev-shm-usage", "--mute-audio",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "--remote-debugging-port=0", "about:blank"]
        self.err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.err,
                                     start_new_session=True)
        self.next_id = 0
        self.ws = None
        try:
            port = self._devtools_port()
            targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = WebSocket(page["webSocketDebuggerUrl"])
            self.call("Page.enable")
            self.call("Runtime.enable")
        except Exception:
            self.close()
            raise

    def _devtools_port(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}: {self.log()[-2000:]}")
            port_file = os.path.join(self.profile, "DevToolsActivePort")
            if os.path.exists(port_file):
                with open(port_file) as f:
                    first = f.readline().strip()
                if first.isdigit():
                    return int(first)
            time.sleep(0.05)
        raise TimeoutError(f"chromium did not open its DevTools port in {timeout}s: {self.log()[-2000:]}")

    def log(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def call(self, method, timeout=30, **params):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.time() + timeout
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
        raise TimeoutError(f"{method}: no answer in {timeout}s")

    def navigate(self, url):
        self.call("Page.navigate", url=url)

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails'].get('text')} "
                               f"{r['exceptionDetails'].get('exception', {}).get('description', '')}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout=60, poll=0.1):
        """The first truthy value of `expression`, or TimeoutError."""
        deadline = time.time() + timeout
        while True:
            try:
                v = self.evaluate(expression)
            except RuntimeError:  # e.g. no document.body yet while a navigation commits
                v = None
            if v:
                return v
            if time.time() > deadline:
                raise TimeoutError(f"{timeout}s without {expression}")
            time.sleep(poll)

    def screenshot(self, path):
        r = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))

    def close(self):
        if self.ws:
            self.ws.close()
        # The browser's whole group (zygote, renderers), even when its main process has gone.
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.err.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
