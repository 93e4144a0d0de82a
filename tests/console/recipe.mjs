// The drives recipe (shared spec drives-recipe.md), step by step through the web console in Debian's
// headless Chromium, against `astraeus dev --no-data-location` (tests/console.rs starts it and runs
// this file; run it by hand the same way: ASTRAEUS_URL=http://127.0.0.1:8080 ASTRAEUS_TOKEN=...
// node tests/console/recipe.mjs).
//
// It signs in, confirms both machines' data locations, creates the recipe's drive with Edit as
// JSON, starts the inspect run from the form with `food101:/data`, watches its worker go from
// Preparing to Completed, reads `read-only, as asked` in its logs, finds the copy marked complete,
// runs the recipe's second run, manages tokens and host paths, and deletes the runs and the drive.
// With a machine whose heartbeats it sends itself, it checks that a run waiting for a data location
// says why in the run list, that an open run page follows changes through the watch streams and
// reads nothing while nothing changes, and that a filling copy's progress bar moves with each
// heartbeat on the drive page and on the waiting worker.
// A screenshot of each page goes to $ASTRAEUS_ARTIFACTS (default artifacts/console).

import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..', '..');
const BASE = (process.env.ASTRAEUS_URL ?? '').replace(/\/+$/, '');
const TOKEN = process.env.ASTRAEUS_TOKEN ?? '';
const ARTIFACTS = process.env.ASTRAEUS_ARTIFACTS ?? join(repo, 'artifacts', 'console');
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
/** The longest any one wait may take (a fill and a worker on a busy 2-core machine). */
const PATIENCE = Number(process.env.ASTRAEUS_PATIENCE_MS ?? 120_000);

if (!BASE || !TOKEN) {
  console.error('recipe.mjs: set ASTRAEUS_URL (e.g. http://127.0.0.1:8080) and ASTRAEUS_TOKEN');
  process.exit(2);
}
mkdirSync(ARTIFACTS, { recursive: true });

// The recipe's drive, with a fill that needs no internet: three small parquet-named files, a pause
// so the copy is seen filling, then the marker, last. It runs in busybox, from the tests' own
// registry (the download needs Python and the network).
const LOCAL_FILL =
  'set -e; mkdir -p /drive/food101/data; for i in 0 1 2; do head -c 100000 /dev/urandom > ' +
  '/drive/food101/data/train-0000$i-of-00008.parquet; done; sleep 10; echo /drive/food101; ' +
  'touch /drive/.astralyx-filled';
const drive = JSON.parse(readFileSync(join(repo, 'examples', 'drive.json'), 'utf8'));
drive.spec.fill.template.args = ['-c', LOCAL_FILL];
drive.spec.fill.template.image = 'busybox:1.36';
const inspect = JSON.parse(readFileSync(join(repo, 'examples', 'inspect.json'), 'utf8'));
const inspectScript = inspect.spec.task_template.args[1];

// ---------------------------------------------------------------------------------------------
// Harness: steps, screenshots, the API (for checks only: the console does the work).

let passed = 0;
let failed = 0;
let page;
/** A machine without an agent, whose heartbeats this file sends (see fakeMachine). */
let gpu03;

async function step(name, fn) {
  const started = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok ${passed + failed} - ${name} (${((Date.now() - started) / 1000).toFixed(1)}s)`);
  } catch (e) {
    failed++;
    console.log(`not ok ${passed + failed} - ${name}`);
    if (page) {
      await page.screenshot({ path: join(ARTIFACTS, `failed-${slug(name)}.png`), fullPage: true }).catch(() => {});
      console.log(`  at ${page.url()}\n  page text:\n${indent((await page.locator('main').innerText().catch(() => '')) || '')}`);
    }
    throw e;
  }
}

const slug = (s) => s.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
const indent = (s) => s.split('\n').map((l) => '    ' + l).join('\n');

async function shot(name, p = page) {
  await p.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

async function api(method, path, body) {
  const response = await fetch(`${BASE}/api/v1${path}`, {
    method,
    headers: { authorization: `Bearer ${TOKEN}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  return { status: response.status, body: text && response.headers.get('content-type')?.includes('json') ? JSON.parse(text) : text };
}

/**
 * A machine with no agent behind it: joined with a join token, and kept Ready by heartbeats sent
 * from here every 2 s, which report `copies` as an agent would find them on its disk.
 */
async function fakeMachine(name) {
  const minted = await api('POST', '/clusters/main/join-tokens', {});
  assert.equal(minted.status, 201, JSON.stringify(minted.body));
  const join = { join_token: minted.body.token, name, capacity: { cpu_cores: 4, memory_bytes: 8 * 2 ** 30, gpus: 0 } };
  const joined = await fetch(`${BASE}/agent/v1/join`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(join),
  });
  const text = await joined.text();
  assert.equal(joined.status, 200, text);
  const { credential } = JSON.parse(text);
  // One heartbeat at a time, in order, as an agent sends them: a report never overtakes a newer one.
  let last = Promise.resolve();
  const send = async () => {
    const used = machine.copies.reduce((sum, c) => sum + c.bytes, 0);
    const body = { data_location: { total_bytes: 100e9, used_bytes: used, free_bytes: 100e9 - used }, copies: machine.copies };
    const reply = await fetch(`${BASE}/agent/v1/heartbeat`, {
      method: 'POST',
      headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    assert.equal(reply.status, 200, await reply.text());
  };
  const machine = {
    copies: [],
    beat() {
      last = last.then(send, send);
      return last;
    },
    stop() {
      clearInterval(machine.timer);
    },
  };
  await machine.beat();
  machine.timer = setInterval(() => machine.beat().catch((e) => console.log(`  heartbeat of ${name}: ${e.message}`)), 2000);
  return machine;
}

/** Waits until `check()` gives a truthy value; fails with what was last seen. */
async function eventually(what, check, timeout = PATIENCE) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeout / 1000}s; last seen: ${last}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The page's `main` text, for waiting on what the console shows. */
const mainText = () => page.locator('main').innerText();

async function waitText(locator, text, timeout = PATIENCE) {
  let shown = '';
  const check = async () => (shown = await locator.innerText()).includes(text);
  await eventually(`"${text}" in ${locator}`, check, timeout).catch((e) => {
    throw new Error(`${e.message}; it shows: ${shown}`);
  });
}

async function clickNav(label) {
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: label, exact: true }).click();
  await page.getByRole('heading', { level: 1, name: label, exact: true }).waitFor();
}

// ---------------------------------------------------------------------------------------------

const external = [];
const pageErrors = [];
/** Every request the main tab made, in order. */
const requests = [];
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
    '--disable-quic',
  ],
});
const timer = setTimeout(() => {
  console.log('recipe.mjs: gave up after 10 minutes');
  process.exit(3);
}, 10 * 60_000);

try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  context.setDefaultTimeout(30_000);
  // The console loads nothing from elsewhere: no CDN fonts, scripts or images.
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (url.startsWith(BASE + '/') || url === BASE) return route.continue();
    external.push(url);
    return route.abort();
  });
  page = await context.newPage();
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('request', (r) => requests.push(r.url()));

  await step('the console is served at / and asks for a token', async () => {
    await page.goto(`${BASE}/`);
    await page.getByRole('heading', { name: 'Sign in to Astraeus' }).waitFor();
    await shot('01-sign-in');
  });

  await step('a token the server refuses is shown as its message', async () => {
    await page.getByLabel('API token').fill('not-a-token');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('.field-error', { hasText: 'not an Astraeus API token' }).waitFor();
    // A well-formed token signed by someone else: the API's own 401 message.
    const [h, p] = TOKEN.split('.');
    await page.getByLabel('API token').fill(`${h}.${p}.c2lnbmF0dXJl`);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').filter({ hasText: 'Not signed in: the token is not valid' }).waitFor();
  });

  await step('signing in with the token opens Drives; Sign out forgets it', async () => {
    await page.getByLabel('API token').fill(TOKEN);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { level: 1, name: 'Drives' }).waitFor();
    assert.equal(new URL(page.url()).pathname, '/drives');
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('heading', { name: 'Sign in to Astraeus' }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.length + localStorage.length), 0);
  });

  await step("dev mode's #token= address signs in directly and clears the fragment", async () => {
    await page.goto(`${BASE}/#token=${TOKEN}`);
    await page.getByRole('heading', { level: 1, name: 'Drives' }).waitFor();
    const url = new URL(page.url());
    assert.equal(url.hash, '', 'the token is removed from the address');
    assert.equal(url.pathname, '/drives');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('astraeus.token')), TOKEN);
    await page.getByText('default · admin · org admin').waitFor();
    await page.getByText('No drives yet').waitFor();
    await shot('02-drives-empty');
  });

  await step('the keyboard reaches the skip link first, and it leads to the page', async () => {
    await page.reload();
    await page.getByRole('heading', { level: 1, name: 'Drives' }).waitFor();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Skip to content');
    await page.keyboard.press('Enter');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'New drive');
  });

  for (const machine of ['gpu-01', 'gpu-02']) {
    await step(`Machines → ${machine} → Data location → Confirm`, async () => {
      await clickNav('Machines');
      const row = page.locator(`tr[data-machine="${machine}"]`);
      await waitText(row, 'Not confirmed');
      if (machine === 'gpu-01') await shot('03-machines-unconfirmed');
      await row.getByRole('link', { name: machine }).click();
      await page.getByRole('heading', { level: 1, name: machine }).waitFor();
      await page.getByText('No data location is confirmed').waitFor();
      const path = page.getByLabel('Path on the machine');
      const proposed = await path.inputValue();
      assert.match(proposed, new RegExp(`/machines/${machine}$`), 'the agent proposed a path');
      if (machine === 'gpu-01') await shot('04-machine-confirm');
      // A relative path is refused, next to the field.
      await path.fill('relative/path');
      await page.getByRole('button', { name: 'Confirm' }).click();
      await page.locator('#dl-path-error').waitFor();
      assert.equal(await path.getAttribute('aria-invalid'), 'true');
      await path.fill(proposed);
      await page.getByRole('button', { name: 'Confirm' }).click();
      await page.getByText(`Data location confirmed: ${proposed}.`).waitFor();
      await waitText(page.locator('[data-testid="data-path"]'), proposed);
      const m = (await api('GET', `/machines/${machine}`)).body;
      assert.equal(m.status.data_location.confirmed, true);
      assert.equal(m.status.data_location.path, proposed);
    });
  }

  await step('Machines lists both with a bar of data-location use', async () => {
    await clickNav('Machines');
    for (const machine of ['gpu-01', 'gpu-02']) {
      await page.locator(`tr[data-machine="${machine}"] [role="progressbar"]`).waitFor();
    }
    await shot('05-machines');
  });

  await step('the New drive form shows the API’s message next to the field it names', async () => {
    await clickNav('Drives');
    await page.getByRole('link', { name: 'New drive' }).click();
    await page.getByRole('heading', { level: 1, name: 'New drive' }).waitFor();
    for (const label of [
      "On each machine's data location",
      'Mounted in workers at',
      'Read-only',
      'Expected size',
      'A cache',
    ]) {
      await page.getByLabel(label, { exact: true }).waitFor();
    }
    await page.getByLabel('Name', { exact: true }).fill('bad-drive');
    await page.getByLabel('Mounted in workers at').fill('data');
    await page.getByLabel('Script').fill('touch /drive/.astralyx-filled');
    await page.getByRole('button', { name: 'Create drive' }).click();
    const error = page.locator('#mount-error');
    await error.waitFor();
    assert.match(await error.innerText(), /absolute/);
    await page.getByText('one field needs a change').waitFor();
    await shot('06-drive-new-form-error');
  });

  await step('Drives → New drive, choose the cluster, Edit as JSON, paste drive.json, Create drive', async () => {
    await page.getByLabel('Cluster').selectOption('main');
    await page.getByRole('button', { name: 'Edit as JSON' }).click();
    const json = page.getByLabel('Drive as JSON');
    await json.fill(JSON.stringify(drive, null, 2));
    await shot('07-drive-new-json');
    await page.getByRole('button', { name: 'Create drive' }).click();
    await page.getByRole('heading', { level: 1, name: 'food101' }).waitFor();
    assert.equal(new URL(page.url()).pathname, '/drives/food101');
    await page.getByText('Drive food101 created.').waitFor();
    await page.locator('dl.facts').waitFor();
    const text = await mainText();
    for (const fact of ["On each machine's data location", '/data', 'Read-only', '6.0 GB', 'default.food101']) {
      assert.ok(text.includes(fact), `the drive page shows ${fact}`);
    }
    await page.getByText('No copies yet').waitFor();
    await shot('08-drive-created');
  });

  let machine;
  await step('Runs → New run: the form with Drives food101:/data, Start run', async () => {
    await clickNav('Runs');
    await page.getByRole('link', { name: 'New run' }).click();
    await page.getByRole('heading', { level: 1, name: 'New run' }).waitFor();
    await page.getByLabel('Name', { exact: true }).fill('inspect-food101');
    await page.getByLabel('Image').fill('busybox:1.36');
    await page.getByLabel('Command').fill('sh');
    await page.getByLabel('Arguments').fill(`-c\n${inspectScript}`);
    await page.getByLabel('Drives', { exact: true }).fill('food101:/data');
    await page.getByLabel('CPU cores').fill('1');
    await page.getByLabel('Memory', { exact: true }).fill('256');
    await page.getByLabel('Unit of memory').selectOption('MiB');
    await shot('09-run-new-form');
    await page.getByRole('button', { name: 'Start run' }).click();
    await page.getByRole('heading', { level: 1, name: 'inspect-food101' }).waitFor();
    const run = (await api('GET', '/runs/inspect-food101')).body;
    assert.deepEqual(run.spec.task_template.datavolume_refs, [{ name: 'food101', mount_path: '/data', mode: 'ReadOnly' }]);
    assert.deepEqual(run.spec.task_template.args, inspect.spec.task_template.args);
    assert.equal(run.spec.task_template.requested_resources.memory_bytes, 268435456);
  });

  await step('the worker is Preparing, waiting for the fill on its machine', async () => {
    const row = page.locator('tr[data-worker="inspect-food101-0"]');
    await eventually('the worker Preparing', async () => (await row.innerText()).includes('Preparing'));
    const text = await row.innerText();
    const m = text.match(/Waiting for drive default\.food101 to be filled on (gpu-0\d)/);
    assert.ok(m, `the reason names the drive and the machine: ${text}`);
    machine = m[1];
    await shot('10-run-preparing');
  });

  await step('the drive page shows the copy filling with a progress bar, and its fill run', async () => {
    const other = await page.context().newPage();
    try {
      // A new tab has its own sessionStorage: sign it in the way dev mode's address does.
      await other.goto(`${BASE}/drives/food101#token=${TOKEN}`);
      const row = other.locator(`tr[data-machine="${machine}"]`);
      await row.locator('[role="progressbar"]').waitFor({ timeout: PATIENCE });
      assert.match(await row.innerText(), /of 6\.0 GB expected/);
      await other.getByRole('link', { name: `fill-food101-${machine}` }).waitFor();
      await shot('11-drive-filling', other);
    } finally {
      await other.close();
    }
  });

  await step('the worker goes from Preparing to Completed without a reload', async () => {
    const row = page.locator('tr[data-worker="inspect-food101-0"]');
    await eventually('the worker Completed', async () => (await row.innerText()).includes('Completed'));
    assert.ok((await row.innerText()).includes(machine));
    await waitText(page.locator('.status-line'), 'All workers completed');
  });

  await step('its logs show the data and `read-only, as asked`', async () => {
    const logs = page.getByRole('log', { name: 'Logs of inspect-food101-0' });
    await waitText(logs, 'read-only, as asked');
    const text = await logs.innerText();
    assert.match(text, /\/data\/food101/);
    assert.match(text, /train-00000-of-00008\.parquet/);
    await page.locator('.log-status[data-status="ended"]').waitFor();
    // Events say why: where the scheduler placed the worker, and what ran it.
    await waitText(page.getByRole('region', { name: 'Events', exact: true }), `placed on ${machine}`);
    await shot('12-run-completed-logs');
  });

  await step('Runs lists state and reason; its filters live in the address', async () => {
    await clickNav('Runs');
    await page.getByLabel('Include ended runs').check();
    await eventually('ended=1 in the address', async () => page.url().includes('ended=1'));
    const fill = page.locator(`tr[data-run="fill-food101-${machine}"]`);
    await waitText(fill, 'Completed');
    await waitText(page.locator('tr[data-run="inspect-food101"]'), 'All workers completed');
    await page.getByLabel('State').selectOption('Completed');
    await eventually('state=Completed in the address', async () => page.url().includes('state=Completed'));
    await page.getByLabel('Name contains').fill('inspect');
    await eventually('q=inspect in the address', async () => page.url().includes('q=inspect'));
    await page.reload();
    await page.getByRole('heading', { level: 1, name: 'Runs' }).waitFor();
    assert.equal(await page.getByLabel('State').inputValue(), 'Completed');
    assert.equal(await page.getByLabel('Name contains').inputValue(), 'inspect');
    await page.locator('tr[data-run="inspect-food101"]').waitFor();
    assert.equal(await page.locator(`tr[data-run="fill-food101-${machine}"]`).count(), 0);
    await shot('13-runs-filtered');
  });

  await step('the drive page: Copies lists the machine, folder, size, complete and last used', async () => {
    await page.goto(`${BASE}/drives/food101`);
    const row = page.locator(`tr[data-machine="${machine}"]`);
    await waitText(row, 'Complete');
    const text = await row.innerText();
    assert.match(text, new RegExp(`/machines/${machine}/drives/default\\.food101`));
    assert.match(text, /300\.\d kB/, `the copy's size: ${text}`);
    assert.equal(await row.locator('[role="progressbar"]').count(), 0, 'no bar once complete');
    assert.equal(await row.locator('time').count(), 1, 'when it was last used');
    const fills = page.locator('section', { has: page.getByRole('heading', { name: 'Fill runs' }) });
    await waitText(fills, `fill-food101-${machine}`);
    await waitText(fills, 'All workers completed');
    await page.getByRole('region', { name: 'Events', exact: true }).waitFor();
    const d = (await api('GET', '/drives/food101')).body;
    assert.deepEqual(
      d.copies.map((c) => [c.node, c.complete]),
      [[machine, true]],
    );
    await shot('14-drive-copy-complete');
  });

  await step('Runs → New run → Edit as JSON: the same run again goes to the copy; Used by lists it', async () => {
    await page.goto(`${BASE}/runs/new`);
    await page.getByRole('button', { name: 'Edit as JSON' }).click();
    const second = structuredClone(inspect);
    second.metadata.name = 'inspect-food101-2';
    // A pause so the drive page can be seen while the worker uses the copy.
    second.spec.task_template.args = ['-c', `sleep 8; ${inspectScript}`];
    await page.getByLabel('Run as JSON').fill(JSON.stringify(second, null, 2));
    await page.getByRole('button', { name: 'Start run' }).click();
    await page.getByRole('heading', { level: 1, name: 'inspect-food101-2' }).waitFor();
    const row = page.locator('tr[data-worker="inspect-food101-2-0"]');
    await eventually('the second worker Running', async () => (await row.innerText()).includes('Running'));
    assert.ok((await row.innerText()).includes(machine), 'placement follows the data');

    await page.goto(`${BASE}/drives/food101`);
    const used = page.locator('section', { has: page.getByRole('heading', { name: 'Used by' }) });
    await waitText(used, 'inspect-food101-2-0');
    await shot('15-drive-used-by');
  });

  await step('deleting a drive in use shows the 409 reason', async () => {
    await page.getByRole('button', { name: 'Delete' }).click();
    await page.getByRole('button', { name: 'Yes, delete drive food101' }).click();
    const alert = page.getByRole('alert').filter({ hasText: 'Not deleted:' });
    await alert.waitFor();
    assert.match(await alert.innerText(), /drive food101 is used by worker inspect-food101-2-0/);
    await shot('16-drive-delete-refused');
  });

  await step('the second run completes without a second fill', async () => {
    await page.goto(`${BASE}/runs/inspect-food101-2`);
    await waitText(page.locator('tr[data-worker="inspect-food101-2-0"]'), 'Completed');
    await waitText(page.getByRole('log'), 'read-only, as asked');
    const runs = (await api('GET', '/runs?all=true')).body.items.map((r) => r.metadata.name);
    assert.deepEqual(runs.filter((n) => n.startsWith('fill-')), [`fill-food101-${machine}`]);
  });

  await step('Used by shows 100 workers, and the next page with Show more workers', async () => {
    const ended = async () => (await api('GET', '/runs/inspect-food101-2')).body.status.state === 'Completed';
    await eventually('inspect-food101-2 Completed, so it no longer uses the drive', ended);
    // 101 workers that ask for more GPUs than any machine has stay Pending, mounting the drive.
    const queue = structuredClone(inspect);
    queue.metadata.name = 'queue';
    queue.spec.replicas = 101;
    queue.spec.task_template.requested_resources.gpus = 64;
    assert.equal((await api('POST', '/runs', queue)).status, 201);
    await page.goto(`${BASE}/drives/food101`);
    const used = page.locator('section', { has: page.getByRole('heading', { name: 'Used by' }) });
    const rows = used.locator('tbody tr');
    await eventually('the first page of users', async () => (await rows.count()) === 100);
    assert.ok(!(await used.innerText()).includes('queue-100'), 'the 101st worker waits for the next page');
    await used.getByRole('button', { name: 'Show more workers' }).click();
    await waitText(used, 'queue-100');
    await eventually('the second page below the first', async () => (await rows.count()) === 101);
    assert.equal(await used.getByRole('button', { name: 'Show more workers' }).count(), 0, 'no page follows the last');
    await shot('16b-drive-used-by-more');
  });

  await step('a run page shows 100 workers, and the next page with Show more workers', async () => {
    await page.goto(`${BASE}/runs/queue`);
    const workers = page.locator('section', { has: page.getByRole('heading', { name: 'Workers' }) });
    const rows = workers.locator('tbody tr');
    await eventually('the first page of workers', async () => (await rows.count()) === 100);
    assert.equal(await rows.last().getAttribute('data-worker'), 'queue-99', 'index order: 99 before 100');
    await workers.getByRole('button', { name: 'Show more workers' }).click();
    await workers.locator('tr[data-worker="queue-100"]').waitFor();
    await eventually('the second page below the first', async () => (await rows.count()) === 101);
    assert.equal(await workers.getByRole('button', { name: 'Show more workers' }).count(), 0, 'no page follows the last');
    assert.equal((await api('DELETE', '/runs/queue')).status, 204);
  });

  await step('the machine page lists its copy and its data location, and its transfer limits', async () => {
    const limits = { upload_bytes_per_second: 100000000, download_bytes_per_second: null };
    assert.equal((await api('PUT', `/machines/${machine}/transfer-limits`, limits)).status, 200);
    await page.goto(`${BASE}/machines/${machine}`);
    await waitText(page.locator('dl.facts'), 'sends 100.0 MB/s, receives no limit');
    const copies = page.locator('section', { has: page.getByRole('heading', { name: 'Copies' }) });
    await waitText(copies, 'food101');
    await waitText(copies, 'Complete');
    await page.locator('.panel [role="progressbar"]').waitFor();
    await shot('17-machine-copy');
    const lifted = { upload_bytes_per_second: null, download_bytes_per_second: null };
    assert.equal((await api('PUT', `/machines/${machine}/transfer-limits`, lifted)).status, 200);
  });

  await step('the machine page lists the workers on it, each linked to its run', async () => {
    const sleeper = structuredClone(inspect);
    sleeper.metadata.name = 'sleeper';
    sleeper.spec.task_template.args = ['-c', 'sleep 300'];
    sleeper.spec.task_template.datavolume_refs = [];
    // A worker mounting nothing would spare the machine holding the copy: this one is named.
    sleeper.spec.task_template.requested_resources.node_selection = { mode: 'Exact', names: [machine] };
    assert.equal((await api('POST', '/runs', sleeper)).status, 201);
    const workers = page.locator('section', { has: page.getByRole('heading', { name: 'Workers' }) });
    await waitText(workers, 'sleeper-0');
    await waitText(workers, 'Running');
    await workers.getByRole('link', { name: 'sleeper-0' }).click();
    await page.waitForURL(`${BASE}/runs/sleeper?worker=sleeper-0`);
    await page.getByRole('heading', { name: 'Logs of sleeper-0' }).waitFor();
    assert.equal((await api('DELETE', '/runs/sleeper')).status, 204);
  });

  await step('Machines → gpu-01 → Scheduling: cordon it, then take new workers again', async () => {
    await page.goto(`${BASE}/machines/gpu-01`);
    const scheduling = page.locator('section', { has: page.getByRole('heading', { name: 'Scheduling' }) });
    const cordoned = async () => (await api('GET', '/machines/gpu-01')).body.status.cordoned;
    await waitText(scheduling, 'Takes new workers.');
    await scheduling.getByRole('button', { name: 'Cordon', exact: true }).click();
    await waitText(scheduling, 'Cordoned: it takes no new workers');
    await eventually('the API says gpu-01 is cordoned', async () => (await cordoned()) === true);
    await shot('17b-machine-cordoned');
    await scheduling.getByRole('button', { name: 'Take new workers again' }).click();
    await waitText(scheduling, 'Takes new workers.');
    await eventually('the API says gpu-01 takes new workers', async () => (await cordoned()) === false);
  });

  await step('Machines → gpu-01 → Transfers with peers: a limit out of range is named, one in range is saved', async () => {
    await page.goto(`${BASE}/machines/gpu-01`);
    const transfers = page.locator('section', { has: page.getByRole('heading', { name: 'Transfers with peers' }) });
    await transfers.getByLabel('Sends at most (MB/s)').fill('0.5');
    await transfers.getByRole('button', { name: 'Save limits' }).click();
    await waitText(transfers.locator('#upload-rate-error'), 'must be 1000000');
    await waitText(transfers, 'Not changed: one field needs a change');
    await transfers.getByLabel('Sends at most (MB/s)').fill('100');
    await transfers.getByRole('button', { name: 'Save limits' }).click();
    await waitText(page.locator('dl.facts'), 'sends 100.0 MB/s, receives no limit');
    const limits = (await api('GET', '/machines/gpu-01')).body.status.transfer_limits;
    assert.deepEqual(limits, { upload_bytes_per_second: 100000000, download_bytes_per_second: null });
    await shot('17c-machine-transfer-limits');
    await transfers.getByLabel('Sends at most (MB/s)').fill('');
    await transfers.getByRole('button', { name: 'Save limits' }).click();
    await waitText(page.locator('dl.facts'), 'no limit set');
  });

  await step('Drives counts the drive’s copies by state', async () => {
    await clickNav('Drives');
    await waitText(page.locator('tr', { hasText: 'food101' }), '1 complete');
  });

  await step('Settings → Tokens: create one (shown once), then revoke it', async () => {
    await clickNav('Settings');
    await page.locator('tr[data-token="dev"]').waitFor();
    await page.getByLabel('Name', { exact: true }).fill('ci');
    await page.getByLabel('Role').selectOption('viewer');
    await page.getByRole('button', { name: 'Create token' }).click();
    const created = page.getByLabel('The new token');
    await created.waitFor();
    const token = await created.inputValue();
    assert.equal(token.split('.').length, 3);
    const row = page.locator('tr[data-token="ci"]');
    await waitText(row, 'viewer');
    await shot('18-settings-tokens');
    await row.getByRole('button', { name: 'Revoke ci' }).click();
    await row.getByRole('button', { name: 'Yes, revoke ci' }).click();
    await waitText(row, 'Revoked');
    const status = async () => (await fetch(`${BASE}/api/v1/drives`, { headers: { authorization: `Bearer ${token}` } })).status;
    await eventually('a revoked token stops working', async () => (await status()) === 401);
  });

  await step('Settings → Clusters → Change → Host paths', async () => {
    await page.locator('tr[data-cluster="main"]').getByRole('link', { name: /Change/ }).click();
    await page.getByRole('heading', { level: 1, name: 'Host paths' }).waitFor();
    await page.getByLabel('Host path 1').fill('/');
    await page.getByRole('button', { name: 'Save host paths' }).click();
    await page.locator('#hp-0-error', { hasText: 'whole machine' }).waitFor();
    await page.getByLabel('Host path 1').fill('/datasets');
    await page.getByRole('button', { name: 'Add a path' }).click();
    await page.getByLabel('Host path 2').fill('/scratch/shared');
    await page.getByLabel('Grant mode 2').selectOption('ReadWrite');
    await page.getByRole('button', { name: 'Save host paths' }).click();
    await page
      .getByText('Saved: workspace default may use /datasets (ReadOnly), /scratch/shared (ReadWrite) on main.')
      .waitFor();
    const granted = (await api('GET', '/workspaces/default/clusters/main/host-paths')).body;
    assert.deepEqual(granted.paths, [
      { path: '/datasets', mode: 'ReadOnly' },
      { path: '/scratch/shared', mode: 'ReadWrite' },
    ]);
    await shot('19-settings-host-paths');
  });

  const isRead = (url) => /\/api\/v1\/(runs|drives|machines)(\/|\?|$)/.test(url) && !url.includes('watch=true');
  await step('Runs shows why a waiting run waits: its first waiting worker’s reason', async () => {
    gpu03 = await fakeMachine('gpu-03');
    const waits = structuredClone(inspect);
    waits.metadata.name = 'waits';
    waits.spec.task_template.requested_resources.node_selection = { mode: 'Exact', names: ['gpu-03'] };
    assert.equal((await api('POST', '/runs', waits)).status, 201);
    await clickNav('Runs');
    const row = page.locator('tr[data-run="waits"]');
    await waitText(row, 'Choose where to keep data on gpu-03');
    assert.match(await row.innerText(), /Pending/);
    // The run's own reason is its waiting worker's, as the API gives it: the other machines are
    // not among the names it asks for.
    const run = (await api('GET', '/runs/waits')).body;
    assert.equal(run.status.reason, run.status.workers[0].status.reason);
    assert.match(run.status.reason, /^0\/3 machines are available: .*1 Choose where to keep data on gpu-03/);
    assert.equal(await row.locator('td').nth(2).innerText(), run.status.reason);
    await shot('19b-runs-waiting-reason');
  });

  await step('an open run page follows a change made through the API, and reads nothing while nothing changes', async () => {
    await page.locator('tr[data-run="waits"]').getByRole('link', { name: 'waits' }).click();
    await page.getByRole('heading', { level: 1, name: 'waits' }).waitFor();
    const status = page.locator('.status-line');
    await waitText(status, 'Choose where to keep data on gpu-03');
    await page.getByRole('heading', { name: 'Logs of waits-0' }).waitFor();
    await page.evaluate(() => (window.sameDocument = true));
    // Three times the 2 s the console used to poll at: the run is read once and then followed.
    const from = requests.length;
    await new Promise((r) => setTimeout(r, 6000));
    assert.deepEqual(requests.slice(from).filter(isRead), [], 'no reads of runs, drives or machines while nothing changed');
    assert.ok(
      requests.some((u) => u.includes('/api/v1/runs?watch=true')),
      'the console follows runs through their watch stream',
    );

    // Placed once an admin confirms a data location (through the API, not this page), the
    // worker waits for its fill, and the run for its workers.
    const confirmed = await api('POST', '/machines/gpu-03/data-location', { path: '/var/lib/astraeus' });
    assert.equal(confirmed.status, 200, JSON.stringify(confirmed.body));
    await waitText(status, 'Waiting for workers to start');
    await waitText(page.locator('tr[data-worker="waits-0"]'), 'Waiting for drive default.food101 to be filled on gpu-03');
    assert.deepEqual(
      requests.slice(from).filter((u) => u.endsWith('/api/v1/runs/waits')),
      [],
      'the run as its stream sent it, not read again',
    );
    assert.equal(await page.evaluate(() => window.sameDocument), true, 'without a reload');
    await shot('19c-run-followed');
  });

  await step('a filling copy’s progress bar moves with its heartbeats, on the drive page and the waiting worker', async () => {
    const food101 = (await api('GET', '/drives/food101')).body;
    const copy = { drive: 'default.food101', drive_id: food101.metadata.uid, bytes: 1.5e9, complete: false, last_used_at: null };
    gpu03.copies = [copy];
    await gpu03.beat();
    await page.getByRole('link', { name: 'food101', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'food101' }).waitFor();
    const row = page.locator('tr[data-machine="gpu-03"]');
    const bar = row.locator('[role="progressbar"]');
    await waitText(row, 'of 6.0 GB expected (25%)');
    assert.match(await row.innerText(), /1\.5 GB/);
    assert.equal(await bar.getAttribute('aria-valuenow'), '25');
    await page.evaluate(() => (window.sameDocument = true));

    // The second heartbeat gives a rate and the time left at that rate.
    copy.bytes = 3e9;
    await gpu03.beat();
    await waitText(row, 'of 6.0 GB expected (50%)');
    const text = await row.innerText();
    assert.match(text, /3\.0 GB/);
    assert.match(text, /· [\d.]+ [kMGT]?B\/s · about \d+ (s|min) left/, text);
    assert.equal(await bar.getAttribute('aria-valuenow'), '50');
    assert.match(await bar.getAttribute('aria-label'), /^gpu-03: 3\.0 GB of 6\.0 GB expected \(50%\)/);
    await shot('19d-drive-fill-progress');

    // The waiting worker shows the same fill.
    await page.goBack();
    await page.getByRole('heading', { level: 1, name: 'waits' }).waitFor();
    const worker = page.locator('tr[data-worker="waits-0"]');
    await waitText(worker, '3.0 GB of 6.0 GB expected (50%)');
    copy.bytes = 4.5e9;
    await gpu03.beat();
    await waitText(worker, '4.5 GB of 6.0 GB expected (75%)');
    assert.equal(await worker.locator('[role="progressbar"]').getAttribute('aria-valuenow'), '75');
    assert.equal(await page.evaluate(() => window.sameDocument), true, 'without a reload');
    await shot('19e-worker-fill-progress');

    assert.equal((await api('DELETE', '/runs/waits')).status, 204);
    gpu03.stop();
    assert.equal((await api('DELETE', '/machines/gpu-03?cluster=main')).status, 204);
  });

  await step('a phone-width window shows the pages without sideways scrolling', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    for (const [path, name] of [
      ['/drives', 'drives'],
      ['/drives/food101', 'drive'],
      ['/runs/inspect-food101', 'run'],
      ['/machines', 'machines'],
      ['/drives/new', 'drive-new'],
    ]) {
      await page.goto(`${BASE}${path}`);
      await page.locator('h1').waitFor();
      // Loaded: the network never idles while the console follows its watch streams.
      await eventually(`${path} loaded`, async () => (await page.getByRole('status').filter({ hasText: /^Loading / }).count()) === 0);
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 1, `${path} is ${overflow}px wider than the window`);
      await shot(`phone-${name}`);
    }
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await step('delete the runs from their pages', async () => {
    for (const name of ['inspect-food101', 'inspect-food101-2']) {
      await page.goto(`${BASE}/runs/${name}`);
      await page.getByRole('heading', { level: 1, name }).waitFor();
      await page.getByRole('button', { name: 'Delete' }).click();
      // The confirmation takes the focus: Enter confirms from the keyboard.
      await eventually('the confirm button focused', async () =>
        page.evaluate(() => document.activeElement?.textContent?.startsWith('Yes, delete run')),
      );
      if (name === 'inspect-food101') await shot('20-run-delete-confirm');
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { level: 1, name: 'Runs' }).waitFor();
      await page.getByText(`Run ${name} deleted.`).waitFor();
      assert.equal((await api('GET', `/runs/${name}`)).status, 404);
    }
  });

  await step('then delete the drive from its page', async () => {
    await page.goto(`${BASE}/drives/food101`);
    await page.getByRole('heading', { level: 1, name: 'food101' }).waitFor();
    await page.getByRole('button', { name: 'Delete' }).click();
    await page.getByRole('button', { name: 'Yes, delete drive food101' }).click();
    await page.getByRole('heading', { level: 1, name: 'Drives' }).waitFor();
    await page.getByText('Drive food101 deleted.').waitFor();
    await page.getByText('No drives yet').waitFor();
    assert.equal((await api('GET', '/drives/food101')).status, 404);
    const runs = (await api('GET', '/runs?all=true')).body.items;
    assert.deepEqual(runs.map((r) => r.metadata.name), [], 'its fill run went with it');
    await shot('21-drives-after-delete');
  });

  await step('no request left this origin, and no script error happened', async () => {
    assert.deepEqual(external, []);
    assert.deepEqual(pageErrors, []);
  });
} catch (e) {
  console.error(e);
} finally {
  gpu03?.stop();
  clearTimeout(timer);
  await browser.close();
}

console.log(`screenshots: ${ARTIFACTS}`);
console.log(`console: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
