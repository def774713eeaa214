// Load times of `weft ui` measured in a real browser (headless Chromium through the DevTools
// protocol, with puppeteer-core): the run table's first render and a 10-run chart, p50 and p95
// over repeated loads, against a run store of any size.
//
// Set up once (puppeteer-core from npm into an ignored folder; Chromium from the system's
// packages, as tools/browser/install.sh installs it), build weft, and make a store:
//
//     npm install --prefix .cache/ui-bench puppeteer-core@25.19.0
//     cargo build --release -p weft-cli
//     cargo run --release -p weft-track --example list_scale -- 10000 1000 /tmp/store-10k
//     node tools/bench/ui_load.mjs --dir /tmp/store-10k [--loads 20] [--weft target/release/weft]
//
// Each load opens a fresh page at the dashboard and waits until the run table has rows and the
// two newest runs' curves are drawn (what the page shows first); its time is the page's own clock
// from the start of navigation. Then, on that page, ten runs of the table are selected and their
// series fetched and drawn (the page's loadSeries, as ticking ten boxes does, all at once); that is
// the chart's time. Prints a table of both, plus the JSON API's time for the run list.

import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(path.join(ROOT, ".cache", "ui-bench", "package.json"));

function args() {
  const a = { dir: null, loads: 20, weft: path.join(ROOT, "target", "release", "weft"), chromium: "chromium" };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) {
    const key = v[i].replace(/^--/, "");
    if (!(key in a) || v[i + 1] === undefined) throw new Error(`unknown or incomplete flag ${v[i]}`);
    a[key] = key === "loads" ? Number(v[i + 1]) : v[i + 1];
  }
  if (!a.dir) throw new Error("--dir STORE is required (a folder holding runs.db)");
  return a;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

async function waitListening(port, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, "127.0.0.1", () => { c.end(); resolve(true); });
      c.on("error", () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`weft ui did not listen on port ${port} within ${ms} ms`);
}

function quantile(xs, q) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
}

async function main() {
  const a = args();
  const puppeteer = require("puppeteer-core");
  const chromium = execFileSync("sh", ["-c", `command -v ${a.chromium}`]).toString().trim();
  const port = await freePort();
  const ui = spawn(a.weft, ["ui", "--dir", a.dir, "--port", String(port)], { stdio: ["ignore", "ignore", "inherit"] });
  try {
    await waitListening(port, 120_000);
    const url = `http://127.0.0.1:${port}/`;
    // the JSON API alone, as the page's first request for runs asks it
    const api = [];
    for (let i = 0; i < Math.min(a.loads, 5); i++) {
      const t = performance.now();
      const r = await fetch(url + "api/runs");
      await r.json();
      api.push(performance.now() - t);
    }
    const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ["--no-sandbox"] });
    const table = [], chart = [];
    let rows = 0, runs = 0;
    try {
      for (let i = 0; i < a.loads; i++) {
        const page = await browser.newPage();
        await page.goto(url, { waitUntil: "domcontentloaded" });
        await page.waitForFunction(
          () => document.querySelectorAll("#runs tbody tr").length > 0 && document.querySelectorAll("#chart polyline").length > 0,
          { timeout: 120_000, polling: 5 },
        );
        table.push(await page.evaluate(() => performance.now()));
        rows = await page.evaluate(() => document.querySelectorAll("#runs tbody tr").length);
        runs = await page.evaluate(() => state.runs.length);
        chart.push(await page.evaluate(async () => {
          const t = performance.now();
          state.selected = state.runs.slice(0, 10).map((r) => r.id);
          await loadSeries(true);
          const drawn = document.querySelectorAll("#chart polyline").length;
          if (drawn !== 10) throw new Error(`${drawn} curves drawn, not 10`);
          return performance.now() - t;
        }));
        await page.close();
      }
    } finally {
      await browser.close();
    }
    const f = (x) => x.toFixed(0);
    console.log(`store ${a.dir}: ${runs} runs listed, ${rows} rows in the table, ${a.loads} loads (Chromium ${await versionOf(chromium)})`);
    console.log("| | p50 ms | p95 ms | max ms |");
    console.log("|---|---:|---:|---:|");
    console.log(`| GET /api/runs (outside the browser, ${api.length} calls) | ${f(quantile(api, 0.5))} | ${f(quantile(api, 0.95))} | ${f(Math.max(...api))} |`);
    console.log(`| page load to the run table and first chart drawn | ${f(quantile(table, 0.5))} | ${f(quantile(table, 0.95))} | ${f(Math.max(...table))} |`);
    console.log(`| 10-run chart (fetch 10 series, draw) | ${f(quantile(chart, 0.5))} | ${f(quantile(chart, 0.95))} | ${f(Math.max(...chart))} |`);
  } finally {
    ui.kill("SIGTERM");
  }
}

async function versionOf(chromium) {
  try {
    const words = execFileSync(chromium, ["--version"], { stdio: ["ignore", "pipe", "ignore"] }).toString().split(/\s+/);
    return words.find((w) => /^\d+\.\d+/.test(w)) || "?";
  } catch {
    return "?";
  }
}

main().catch((e) => {
  console.error(`ui_load: ${e.message}`);
  process.exit(1);
});
