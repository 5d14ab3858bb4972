"""Raw HTTP for hostile-client tests: bodies the openai client would never send (bad JSON types, deep nesting,
lone surrogates, huge prompts), each bounded by a timeout; and the server process's resident memory."""

from __future__ import annotations

import http.client
import json
import re
import time
from urllib.parse import urlparse


def post(base: str, body: bytes | str | dict, timeout: float = 60,
         path: str = "/v1/chat/completions", parse: bool = True) -> tuple[int, dict | str | bytes, float]:
    """POST ``body`` -> (status, parsed JSON body or raw text, seconds taken); with parse=False the raw bytes (a
    caller timing the server from this process parses a 20 MB answer after, not while, it measures)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    except (ConnectionError, http.client.HTTPException) as exc:  # the server may cut an oversized upload short
        return -1, repr(exc), time.monotonic() - t0
    finally:
        conn.close()
    if not parse:
        return resp.status, raw, time.monotonic() - t0
    try:
        data = json.loads(raw)
    except ValueError:
        data = raw.decode("utf-8", "replace")
    return resp.status, data, time.monotonic() - t0


def get(base: str, path: str, timeout: float = 10) -> tuple[int, str]:
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def metric(base: str, name: str, **labels) -> float:
    """Value of one Prometheus sample of GET /metrics (0 when absent)."""
    _, text = get(base, "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pat = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+-]+)"
    m = re.search(pat, text)
    return float(m.group(1)) if m else 0.0


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def assert_openai_error(status, body, lo: int = 400, hi: int = 499) -> dict:
    """A ``lo``..``hi`` status with OpenAI's error JSON; returns body['error']."""
    assert lo <= status <= hi, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"] and "\n" not in err["message"]
    assert {"type", "param", "code"} <= set(err)
    return err
