#!/usr/bin/env python3
"""ctest dashboard.chromium: the head's dashboard (GET /) in a real headless browser.

`xloco local` with 3 providers and an evaluation every round, its head holding a status token
(XLOCO_HTTP_TOKEN, on loopback: it only unlocks provider addresses there). Debian's Chromium,
driven over the DevTools protocol (tests/dashboard/cdp.py), opens http://HOST:PORT/#token=TOKEN,
and from the page's DOM after two rounds: the loss chart has one point per evaluated round (as
many as /history holds, read before and after the DOM), one row per provider with its state
and address, bytes that grow with the next round, the run's config; opened without the token,
the page shows no address; the run below 95 % utilization shows the head's advice in /status
and on the page. The screenshot goes to ARTIFACTS/dashboard.png (argv[1], default
./artifacts). Skipped (77) with the reason printed where Chromium or the King James Bible is
missing. Signals only its own process groups (the run's and the browser's), always reaped."""
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from cdp import Browser, find_chromium, stop_group, wait_for_status_url  # noqa: E402
from cli_checks import SRC, XLOCO, check, failures  # noqa: E402

if not find_chromium():
    print("skipped: chromium is not installed (Debian package chromium; deploy/setup.sh installs it)")
    sys.exit(77)
if not Path("/usr/bin/bible").exists():
    print("skipped: /usr/bin/bible missing (Debian package bible-kjv)")
    sys.exit(77)

artifacts = Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts").resolve()
artifacts.mkdir(parents=True, exist_ok=True)
TOKEN = "dashboard-test-token-0123456789"


def get(url, path, token=None):
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


DOM = """(() => {
  const q = (s) => Array.from(document.querySelectorAll(s));
  return {
    polls: Number(document.body.dataset.polls || 0),
    history: Number(document.body.dataset.historyRounds || 0),
    points: q('#loss-chart circle.pt').length,
    points_attr: Number(document.getElementById('loss-chart').dataset.points),
    train_points: Number(document.getElementById('loss-chart').dataset.trainPoints || 0),
    train_paths: q('#loss-chart path.series.train').length,
    legend: document.getElementById('loss-legend').textContent,
    bytes: Number(document.getElementById('bytes-total').dataset.bytes),
    util_paths: q('#util-chart path.series').length,
    rows: q('#providers tbody tr.provider').map((tr) => ({name: tr.dataset.name, state: tr.dataset.state,
      text: tr.innerText})),
    addr_header: getComputedStyle(document.querySelector('#providers th.addr')).display !== 'none',
    note: document.getElementById('providers-note').textContent,
    config: document.getElementById('config').textContent,
    round_text: document.getElementById('round').textContent,
    notice: document.getElementById('notice').style.display === 'block' ? document.getElementById('notice').textContent : '',
    advice: getComputedStyle(document.getElementById('advice')).display !== 'none' ? document.getElementById('advice').textContent : '',
  };
})()"""


def evaluated(url):
    return sum(1 for h in get(url, "/history", TOKEN)["rounds"] if h.get("eval_loss") is not None)


with tempfile.TemporaryDirectory(prefix="xloco-dashboard-") as tmp:
    env = dict(os.environ, XLOCO_HTTP_TOKEN=TOKEN)
    args = [XLOCO, "local", "--providers", "3", "--config", str(SRC / "configs/kjv-tiny-4p.json"),
            "--set", f"run.dir={tmp}", "--set", "run.name=dash", "--set", "outer.inner_steps=5",
            "--set", "inner.steps=150", "--set", "outer.eval_every=1", "--set", "inner.eval_batches=4",
            "--set", "inner.log_every=10", "--set", "inner.warmup_steps=5", "--set", "outer.min_providers=3",
            # zstd at its slowest level: each frame takes about a second to pack, time the providers
            # do not compute, so with rounds of 5 steps the run stays well below 95 % utilization
            # and the head advises (at 10 steps a round it measured 0.919 once and 0.955 once)
            "--set", "outer.zstd_level=19"]
    log = open(Path(tmp) / "local.log", "wb")
    run = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    browser = None
    try:
        url = wait_for_status_url(Path(tmp) / "dash" / "status.url", run)
        print(f"dashboard at {url}/")
        browser = Browser(width=1360, height=1100)
        browser.navigate(f"{url}/#token={TOKEN}")
        # Two rounds recorded with their evaluations.
        browser.wait_for("Number(document.body.dataset.historyRounds || 0) >= 2 && "
                         "document.querySelectorAll('#loss-chart circle.pt').length >= 2", timeout=240)
        before = evaluated(url)
        dom = browser.evaluate(DOM)
        after = evaluated(url)
        print(json.dumps({k: v for k, v in dom.items() if k != "config"}, indent=1))
        check(dom["polls"] >= 1 and not dom["notice"], f"the page polled the head without error ({dom['polls']} polls)")
        check(dom["points"] >= 2, f"the loss chart has points after two rounds ({dom['points']})")
        check(dom["points"] == dom["points_attr"], "each evaluated round is one circle in the loss chart")
        check(dom["train_points"] >= 2 and dom["train_paths"] == 1,
              f"the providers' training loss is a line of its own ({dom['train_points']} rounds)")
        check("eval loss" in dom["legend"] and "training loss" in dom["legend"],
              f"the legend tells the lines apart: {dom['legend'][:120]}")
        # The page may be one poll behind /history: its count lies between the count before the
        # DOM was read, less a poll's worth, and the count after.
        check(before - 2 <= dom["points"] <= after,
              f"loss points ({dom['points']}) = the evaluated rounds /history holds ({before}..{after})")
        check(dom["history"] >= dom["points"], "every evaluated round is a round of the history")
        check(dom["util_paths"] == 1, "the utilization chart is drawn")
        names = sorted(r["name"] for r in dom["rows"])
        check(names == ["provider-0", "provider-1", "provider-2"], f"one row per provider ({names})")
        live = ("joining", "active", "straggling")  # a loaded machine may make one straggle
        check(all(r["state"] in live for r in dom["rows"]),
              f"each row has its state ({[r['state'] for r in dom['rows']]})")
        check(all(r["state"] in r["text"] for r in dom["rows"]), "the state is shown in each row")
        check(dom["addr_header"] and all("127.0.0.1" in r["text"] for r in dom["rows"]),
              "with the token in the fragment, the page shows the providers' addresses")
        check('"inner_steps": 5' in dom["config"], "the run's config is on the page")
        check(int(dom["round_text"].split()[0]) >= dom["history"],
              f"the header's round ({dom['round_text']}) is at least the history's ({dom['history']})")
        browser.screenshot(str(artifacts / "dashboard.png"))
        print(f"screenshot: {artifacts / 'dashboard.png'}")
        check((artifacts / "dashboard.png").stat().st_size > 20000, "a screenshot of the page was saved")

        # Live: the next rounds come in without a reload.
        b1, p1 = dom["bytes"], dom["points"]
        browser.wait_for(f"Number(document.getElementById('bytes-total').dataset.bytes) > {b1} && "
                         f"document.querySelectorAll('#loss-chart circle.pt').length > {p1}", timeout=120)
        dom2 = browser.evaluate(DOM)
        check(dom2["bytes"] > b1 and dom2["points"] > p1,
              f"bytes grow ({b1:.0f} -> {dom2['bytes']:.0f}) and the loss chart gains points ({p1} -> {dom2['points']}) without a reload")

        # Advice: zstd level 19 keeps the providers below 95 % busy, so the head advises (from its
        # own measurements) in /status, `xloco status` and on the page.
        recent = [h["utilization"] for h in get(url, "/history", TOKEN)["rounds"][-3:]]
        mean = sum(recent) / len(recent)
        check(mean < 0.95, f"this run's measured utilization is below 95 % ({mean:.3f})")
        browser.wait_for("getComputedStyle(document.getElementById('advice')).display !== 'none'", timeout=60)
        advice = get(url, "/status", TOKEN).get("advice", "")
        dom4 = browser.evaluate(DOM)
        print(f"advice: {advice}")
        check(advice.startswith("utilization "), f"/status carries the advice ({advice[:80]!r})")
        check(dom4["advice"].startswith("Advice: utilization ") and "%" in dom4["advice"],
              f"the dashboard shows the advice ({dom4['advice'][:80]!r})")
        table = subprocess.run([XLOCO, "status", "--head", url], capture_output=True, text=True, timeout=30,
                               env=env).stdout
        check("\nadvice: utilization " in table, "xloco status prints the advice")

        # Without the token: the same page, no addresses.
        browser.navigate("about:blank")  # so that the wait below cannot see the last page
        browser.wait_for("location.href === 'about:blank' && document.readyState === 'complete'")
        browser.navigate(f"{url}/")
        browser.wait_for("location.hash === '' && Number(document.body.dataset.polls || 0) >= 1", timeout=30)
        dom3 = browser.evaluate(DOM)
        check(len(dom3["rows"]) == 3, "without the token the page still shows the providers (loopback)")
        check(not dom3["addr_header"] and not any("127.0.0.1" in r["text"] for r in dom3["rows"]),
              "without the token no provider address is on the page")
        check("token" in dom3["note"], "the page says how to see addresses")
        html = urllib.request.urlopen(url + "/", timeout=5).read().decode()
        check("<script src" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
              and "https://" not in html, "the page loads nothing from elsewhere (no CDN)")
    except Exception as e:  # a failure still reaps the run and the browser (below)
        check(False, f"the dashboard test ran to its end: {e!r}")
        try:
            print((Path(tmp) / "local.log").read_text()[-4000:])
        except OSError:
            pass
    finally:
        try:
            if browser:
                browser.close()
        finally:
            # The run's whole group, even when `xloco local` itself has exited (its head and
            # providers may not have).
            stop_group(run, 30)
            log.close()

print("all checks passed" if not failures else f"{len(failures)} checks failed")
sys.exit(1 if failures else 0)
