#!/usr/bin/env python3
"""Checks the DOM of an `ampdist report` page, as headless Chromium rendered it, against the runs' metrics.jsonl.

    check_report.py DOM_HTML SCREENSHOT_PNG WIDTH HEIGHT RUN_DIR...

DOM_HTML is `chromium --headless --dump-dom` of the page. For every run: its name is on the page; each of the
curve charts (loss, eval, scale, gradnorm, throughput) holds a polyline for it with at least two points; the
results table row has test accuracy and samples/s equal to the run's summary record as the page formats them
(4 and 1 decimals); the phase bars exist when the summary has phase_ms. The screenshot must be a PNG of
WIDTH x HEIGHT pixels that is not one flat colour (the page was painted). Standard library only.

Prints one line and exits 0 when everything holds; otherwise prints "FAIL: ..." and exits 1.
"""
import html.parser
import json
import os
import struct
import sys
import zlib


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack = []  # (tag, attrs) of open elements
        self.polylines = []  # (chart id, run, n points)
        self.rows = {}  # run -> {class: text}
        self.phases = set()  # runs with phase bars
        self.text = []
        self.cur_td = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        chart = next((x.get("id") for t, x in reversed(self.stack) if t == "figure"), None)
        if tag == "polyline" and "curve" in a.get("class", ""):
            self.polylines.append((chart, a.get("data-run"), len(a.get("points", "").split())))
        if tag == "rect" and a.get("class") == "phase":
            self.phases.add(a.get("data-run"))
        if tag == "td":
            row = next((x for t, x in reversed(self.stack) if t == "tr"), {})
            run = row.get("data-run")
            if run and a.get("class") in ("acc", "sps", "skipped"):
                self.cur_td = (run, a["class"])
        if tag not in ("polyline", "rect", "line", "path", "meta", "br", "img"):
            self.stack.append((tag, a))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if tag == "td":
            self.cur_td = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cur_td:
            run, cls = self.cur_td
            self.rows.setdefault(run, {})[cls] = self.rows.get(run, {}).get(cls, "") + data


def png_check(path, w, h):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG")
    width, height, depth, ctype = struct.unpack(">IIBB", data[16:26])
    if (width, height) != (w, h):
        fail(f"{path}: {width}x{height}, expected {w}x{h}")
    idat, pos = b"", 8
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    # Distinct bytes in the decompressed scanlines: a blank page gives a handful (filter bytes and one colour).
    if len(set(raw)) < 32:
        fail(f"{path}: looks blank ({len(set(raw))} distinct byte values)")


dom_path, png, w, h = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dom = Dom()
dom.feed(open(dom_path, encoding="utf-8").read())
text = "".join(dom.text)
png_check(png, w, h)
checked = 0
for run_dir in sys.argv[5:]:
    label = os.path.basename(os.path.normpath(run_dir))
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    summary = [r for r in rows if r["type"] == "summary"][-1]
    if label not in text:
        fail(f"run name {label} not on the page")
    for chart in ("loss", "eval", "scale", "gradnorm", "throughput"):
        lines = [n for c, r, n in dom.polylines if c == chart and r == label]
        if not lines or lines[0] < 2:
            fail(f"chart {chart}: no curve of {label} with >= 2 points ({dom.polylines})")
        checked += 1
    row = dom.rows.get(label)
    if not row:
        fail(f"no results row for {label}: {dom.rows}")
    want_acc = f"{summary['test_accuracy']:.4f}"
    want_sps = f"{summary['samples_per_s']:.1f}"
    if row.get("acc", "").strip() != want_acc:
        fail(f"{label}: table accuracy {row.get('acc')!r} != metrics.jsonl {want_acc}")
    if row.get("sps", "").strip() != want_sps:
        fail(f"{label}: table samples/s {row.get('sps')!r} != metrics.jsonl {want_sps}")
    if row.get("skipped", "").strip() != str(summary["skipped_steps"]):
        fail(f"{label}: table skipped steps {row.get('skipped')!r} != {summary['skipped_steps']}")
    checked += 3
    if "phase_ms" in summary and label not in dom.phases:
        fail(f"no phase bars for {label}")
print(f"ok: {len(sys.argv) - 5} runs on the page, {checked} checks against metrics.jsonl, screenshot {w}x{h}")
