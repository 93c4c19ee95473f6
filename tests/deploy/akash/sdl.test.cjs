// Parses rendered xloco SDL files with Akash's own SDK (@akashnetwork/akashjs), builds their
// manifests and deployment groups as `provider-services` would send them, and checks what an
// xloco run needs from them. Usage: node sdl.test.cjs HEAD.sdl.yaml PROVIDER.sdl.yaml HEAD_ADDR
const { test } = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const { SDL } = require("@akashnetwork/akashjs/build/sdl");

const [headFile, providerFile, headAddress] = process.argv.slice(2);
const parse = (f) => SDL.fromString(fs.readFileSync(f, "utf8"), "beta3");
const service = (sdl) => {
  const groups = sdl.manifest();
  assert.equal(groups.length, 1, "one placement group");
  assert.equal(groups[0].services.length, 1, "one service");
  return groups[0].services[0];
};
const envNames = (svc) => svc.env.map((e) => e.slice(0, e.indexOf("=")));
const envValue = (svc, name) => svc.env.find((e) => e.startsWith(name + "=")).slice(name.length + 1);

test("head: CPU profile, global TCP ports for ZeroMQ and HTTP status, env", () => {
  const sdl = parse(headFile);
  const svc = service(sdl);
  assert.deepEqual([...svc.command, ...svc.args], ["xloco", "head"]);
  assert.equal(svc.resources.gpu.units.val, 0, "the head needs no GPU");
  const ports = Object.fromEntries(svc.expose.map((e) => [e.port, e]));
  for (const port of [7700, 8080]) {
    assert.ok(ports[port], `port ${port} exposed`);
    assert.equal(ports[port].global, true, `port ${port} is global`);
    assert.equal(ports[port].proto, "TCP");
  }
  for (const name of ["XLOCO_CONFIG", "XLOCO_SET", "XLOCO_BIND", "XLOCO_HTTP", "XLOCO_HTTP_TOKEN", "XLOCO_KEY", "XLOCO_ALLOW"]) {
    assert.ok(envNames(svc).includes(name), `env ${name}`);
  }
  assert.equal(envValue(svc, "XLOCO_BIND"), "tcp://0.0.0.0:7700");
  // Z85 keys with '$' arrive doubled for Kubernetes, which turns '$$' back into '$'.
  const allow = envValue(svc, "XLOCO_ALLOW").replaceAll("$$", "$");
  assert.match(allow, /^provider-0=.{40},provider-1=.{40}$/);
  const runs = svc.params.storage.find((s) => s.name === "runs");
  assert.equal(runs.mount, "/var/lib/xloco");
  const persistent = svc.resources.storage.find((s) => s.name === "runs");
  assert.ok(persistent.attributes.some((a) => a.key === "persistent" && a.value === "true"));
  assert.equal(sdl.groups().length, 1);
});

test("provider: NVIDIA h100/a100 80Gi GPUs, shm and persistent storage, env for the head", () => {
  const sdl = parse(providerFile);
  const svc = service(sdl);
  assert.deepEqual([...svc.command, ...svc.args], ["xloco", "worker"]);
  assert.equal(svc.resources.gpu.units.val, 8);
  const gpuKeys = svc.resources.gpu.attributes.map((a) => a.key).sort();
  assert.deepEqual(gpuKeys, ["vendor/nvidia/model/a100/ram/80Gi", "vendor/nvidia/model/h100/ram/80Gi"]);
  const shm = svc.resources.storage.find((s) => s.name === "shm");
  assert.ok(shm.attributes.some((a) => a.key === "class" && a.value === "ram"), "shm is RAM-backed");
  assert.equal(svc.params.storage.find((s) => s.name === "shm").mount, "/dev/shm");
  const runs = svc.resources.storage.find((s) => s.name === "runs");
  assert.ok(runs.attributes.some((a) => a.key === "persistent" && a.value === "true"));
  assert.ok(svc.expose.every((e) => e.global === false), "a provider exposes nothing globally");
  for (const name of ["XLOCO_CONFIG", "XLOCO_SET", "XLOCO_HEAD", "XLOCO_HEAD_PUB", "XLOCO_NAME", "XLOCO_SHARD", "XLOCO_KEY", "XLOCO_NPROC"]) {
    assert.ok(envNames(svc).includes(name), `env ${name}`);
  }
  assert.equal(envValue(svc, "XLOCO_HEAD"), headAddress);
  assert.equal(envValue(svc, "XLOCO_NPROC"), "8", "one rank per GPU");
  assert.equal(envValue(svc, "XLOCO_SHARD"), "0", "the shard is pinned, not first come first served");
  assert.match(envValue(svc, "XLOCO_SET"), /run\.device=auto/);
  // The deployment group the provider bids on carries the same GPU attributes.
  const res = sdl.groups()[0].resources[0].resource;
  const ascii = (v) => Buffer.from(typeof v === "object" ? Object.values(v) : [...String(v)].map((c) => c.charCodeAt(0))).toString();
  assert.equal(ascii(res.gpu.units.val), "8");
  assert.ok(res.gpu.attributes.some((a) => a.key === "vendor/nvidia/model/h100/ram/80Gi"));
});

test("the SDK rejects a provider SDL whose GPU block is broken (the check is real)", () => {
  const broken = fs.readFileSync(providerFile, "utf8").replace(/nvidia:\n(\s+)- model: h100/, "nvidia:\n$1model: h100");
  assert.notEqual(broken, fs.readFileSync(providerFile, "utf8"));
  assert.throws(() => SDL.fromString(broken, "beta3"));
});
