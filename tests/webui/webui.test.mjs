// The web UI of `magnetar serve` in headless Chromium (Debian's /usr/bin/chromium driven by playwright-core), run by
// tests/server/webui_test.cpp against a server it started on the bundled demo model with a small expert cache
// (--stream --cache-gb 0.02, so the expert map has experts both on disk and in RAM).
//
// usage: node webui.test.mjs NPM_DIR BASE_URL OUT_DIR
//   NPM_DIR   folder where `npm install --prefix NPM_DIR playwright-core@VERSION` was run
//   BASE_URL  the server, e.g. http://127.0.0.1:8080
//   OUT_DIR   where the screenshots go (webui-*.png); their paths are printed
// Prints one line per check ("ok - ..." / "FAIL - ...") and exits 1 when one failed.
//
// The demo model's greedy answers are known (models/magnetar-demo.report.json): "Who are you?" starts with
// kAnswerStart; kLongPrompt's answer is asked for with ignore_eos, so that it runs long enough to be stopped.
import { createRequire } from 'node:module';
import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';

const [npmDir, base, outDir] = process.argv.slice(2);
if (!npmDir || !base || !outDir) {
  process.stderr.write('usage: node webui.test.mjs NPM_DIR BASE_URL OUT_DIR\n');
  process.exit(2);
}
const require = createRequire(resolve(npmDir, 'package.json'));
const { chromium } = require('playwright-core');

const kChromium = '/usr/bin/chromium';  // Debian's package (scripts/setup.sh); playwright downloads no browser here
const kAnswerStart = 'I am a tiny language model';
const kLongPrompt = 'Explain Python in detail, with many examples.';
const kLongTokens = 1500;  // the answer that gets stopped (the test's server runs with --ctx 2048)

let passed = 0;
let failed = 0;
function check(ok, what, detail = '') {
  if (ok) {
    passed++;
    console.log(`ok - ${what}`);
  } else {
    failed++;
    console.log(`FAIL - ${what}${detail ? ': ' + detail : ''}`);
  }
  return ok;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function api(path, body) {
  const res = await fetch(base + path, body === undefined ? {} : {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return res.json();
}

mkdirSync(outDir, { recursive: true });
const screenshots = [];
async function shot(target, name) {
  const path = resolve(outDir, name);
  await target.screenshot({ path });
  screenshots.push(path);
}

const browser = await chromium.launch({
  executablePath: kChromium,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(60000);
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  const foreign = [];
  page.on('request', (r) => { if (!r.url().startsWith(base)) foreign.push(r.url()); });

  // ---- the page loads, under its Content-Security-Policy
  const response = await page.goto(base + '/');
  check(response.status() === 200, 'GET / answers 200');
  const csp = response.headers()['content-security-policy'] || '';
  check(csp.includes("default-src 'self'"), "the page has a Content-Security-Policy with default-src 'self'", csp);
  check(await page.title() === 'Magnetar', 'the page title is Magnetar');

  // Greedy answers, no limit: set in the settings panel (kept in localStorage).
  await page.click('#toggle-settings');
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '');
  await page.click('#toggle-settings');

  // Every change of the last assistant answer's text length, as the page shows it.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const all = document.querySelectorAll('#messages .msg.assistant .content');
      const last = all[all.length - 1];
      if (last && window.__lengths[window.__lengths.length - 1] !== last.textContent.length) {
        window.__lengths.push(last.textContent.length);
      }
    }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
  });
  const lastAnswer = () => page.evaluate(() => {
    const all = document.querySelectorAll('#messages .msg.assistant');
    const m = all[all.length - 1];
    if (!m) return null;
    const note = m.querySelector('.note');
    return { text: m.querySelector('.content').textContent, streaming: m.classList.contains('streaming'),
             note: note ? note.textContent : '', error: m.querySelector('.note.error') !== null };
  });
  const waitAnswered = () => page.waitForFunction(() => {
    const all = document.querySelectorAll('#messages .msg.assistant');
    const m = all[all.length - 1];
    return m && !m.classList.contains('streaming') && m.querySelector('.note') !== null &&
           !document.getElementById('send').hidden;
  });
  async function ask(text) {
    await page.evaluate(() => { window.__lengths = []; });
    await page.fill('#input', text);
    await page.press('#input', 'Enter');
  }

  // ---- a message, streamed
  await ask('Who are you?');
  await waitAnswered();
  let answer = await lastAnswer();
  let lengths = await page.evaluate(() => window.__lengths);
  check(!answer.error, 'the answer has no error', answer.note);
  check(answer.text.startsWith(kAnswerStart), `the greedy answer starts with "${kAnswerStart}"`, answer.text);
  check(lengths.filter((n) => n > 0).length >= 2 && lengths.every((n, i) => i === 0 || n > lengths[i - 1]),
        'the answer appeared in growing pieces (streamed)', JSON.stringify(lengths));
  check(/tokens in/.test(answer.note), 'the answer notes its token count', answer.note);
  await shot(page, 'webui-chat.png');

  // ---- a long answer, stopped
  // The page's request gets ignore_eos on its way to the server, so the answer runs to kLongTokens unless stopped:
  // still going when Stop is pressed however fast this machine is, or slow the page under load.
  await page.route('**/v1/chat/completions', (route) => route.continue({
    postData: JSON.stringify(Object.assign(JSON.parse(route.request().postData()), { ignore_eos: true })) }));
  await page.click('#new-chat');
  await page.click('#toggle-settings');
  await page.fill('#max-tokens', String(kLongTokens));
  await page.click('#toggle-settings');
  await ask(kLongPrompt);
  // Stop as soon as the answer has visibly grown three times.
  await page.waitForFunction(() => window.__lengths.filter((n) => n > 0).length >= 3);
  const before = await lastAnswer();
  check(before.streaming && await page.isVisible('#stop'), 'a long answer is streaming with a Stop button');
  await page.click('#stop');
  await page.waitForSelector('#send', { state: 'visible' });
  answer = await lastAnswer();
  lengths = await page.evaluate(() => window.__lengths);
  check(!answer.streaming && answer.note === 'stopped' && !answer.error, 'Stop ends the answer, marked stopped',
        JSON.stringify(answer));
  check(lengths.filter((n) => n > 0).length >= 3, 'the long answer grew over time before the stop',
        JSON.stringify(lengths));
  check(await page.isHidden('#stop') && await page.isEnabled('#send'), 'after Stop the Send button is back');
  await sleep(700);
  check((await lastAnswer()).text === answer.text, 'no text arrives after Stop');
  // The server cancelled the job: it generated fewer tokens than the whole answer has.
  let status = await api('/v1/status');
  for (let i = 0; i < 100 && status.worker.active; i++) {
    await sleep(100);
    status = await api('/v1/status');
  }
  const stoppedTokens = status.worker.last_generated_tokens;
  check(!status.worker.active && stoppedTokens > 0 && stoppedTokens < kLongTokens,
        'the server stopped generating when the page pressed Stop',
        `${stoppedTokens} tokens generated of ${kLongTokens} (worker active: ${status.worker.active})`);
  await shot(page, 'webui-stop.png');
  await page.unroute('**/v1/chat/completions');

  // The UI is usable again: another message in the same conversation gets an answer.
  await page.click('#toggle-settings');
  await page.fill('#max-tokens', '12');
  await page.click('#toggle-settings');
  await ask('Who are you?');
  await waitAnswered();
  answer = await lastAnswer();
  check(!answer.error && answer.text.length > 0, 'after a Stop, the next message is answered', JSON.stringify(answer));

  // ---- conversations survive a reload (localStorage)
  await page.reload();
  await page.waitForSelector('#conversations li');
  const titles = await page.$$eval('#conversations li .title', (els) => els.map((e) => e.textContent));
  check(titles.includes('Who are you?') && titles.includes(kLongPrompt), 'both conversations are listed after a reload',
        JSON.stringify(titles));
  check(await page.$$eval('#messages .msg', (els) => els.length) === 4, 'the current conversation is shown again');
  check(await page.inputValue('#temperature') === '0', 'settings survive a reload');
  await page.click('#conversations li:has-text("Who are you?")');
  check((await lastAnswer()).text.startsWith(kAnswerStart), 'switching conversations shows the other one');

  // ---- markdown is rendered from text, never parsed as HTML
  await page.evaluate(() => {
    const list = JSON.parse(localStorage.getItem('magnetar.conversations'));
    list.push({ id: 'md-test', title: 'markdown', updated: Date.now() + 1e6, messages: [
      { role: 'user', content: '<b>not bold</b>' },
      { role: 'assistant', content: '# Title\n\n**bold**, *italic*, `x < y` and ' +
        '<img src=x onerror="window.__xss = 1"> [a link](https://example.invalid/) [bad](javascript:window.__xss=2)' +
        '\n\n- one\n- two\n  - nested\n\n1. first\n2. second\n\n```js\nconst s = "<script>";\n```\n' },
    ] });
    localStorage.setItem('magnetar.conversations', JSON.stringify(list));
    localStorage.setItem('magnetar.current', JSON.stringify('md-test'));
  });
  await page.reload();
  await page.waitForSelector('#messages .msg.assistant h1');
  const md = await page.evaluate(() => {
    const m = document.querySelector('#messages .msg.assistant .content');
    const a = m.querySelector('a');
    return {
      xss: window.__xss, imgs: document.querySelectorAll('#messages img').length,
      userBold: document.querySelectorAll('#messages .msg.user b').length,
      userText: document.querySelector('#messages .msg.user').textContent,
      strong: m.querySelector('strong')?.textContent, em: m.querySelector('em')?.textContent,
      code: m.querySelector('p code')?.textContent, links: m.querySelectorAll('a').length,
      href: a?.getAttribute('href'), rel: a?.rel, items: m.querySelectorAll(':scope > ul > li').length,
      nested: m.querySelectorAll('ul ul li').length, ordered: m.querySelectorAll('ol > li').length,
      block: m.querySelector('pre code')?.textContent, copy: m.querySelectorAll('.code button').length,
      text: m.textContent,
    };
  });
  check(md.imgs === 0 && md.xss === undefined && md.userBold === 0 && md.userText.includes('<b>not bold</b>'),
        'HTML in messages stays text', JSON.stringify(md));
  check(md.strong === 'bold' && md.em === 'italic' && md.code === 'x < y', 'bold, italic and inline code render',
        JSON.stringify(md));
  check(md.links === 1 && md.href === 'https://example.invalid/' && /noopener/.test(md.rel) &&
        md.text.includes('bad') && !md.text.includes('javascript:'),
        'http(s) links get rel=noopener, other URLs become text', JSON.stringify(md));
  check(md.items === 2 && md.nested === 1 && md.ordered === 2, 'lists render, nested too', JSON.stringify(md));
  check(md.block === 'const s = "<script>";' && md.copy === 1, 'code fences render with a copy button',
        JSON.stringify(md));
  await shot(page, 'webui-markdown.png');
  await page.click('#conversations li:has-text("markdown") .delete');
  check(!(await page.$$eval('#conversations li .title', (els) => els.map((e) => e.textContent))).includes('markdown'),
        'a conversation can be deleted');

  // ---- reasoning_content deltas are shown apart, collapsed. The demo model's thinking is empty, so the server's
  // answer is stood in for by a fixed SSE body (with a keep-alive comment, as during a long prefill).
  const chunk = (delta, finish = null) => 'data: ' + JSON.stringify({ object: 'chat.completion.chunk',
    choices: [{ index: 0, delta, finish_reason: finish }] }) + '\n\n';
  await page.route('**/v1/chat/completions', (route) => route.fulfill({
    status: 200, contentType: 'text/event-stream',
    body: ': keep-alive\n\n' + chunk({ role: 'assistant', content: '' }) + chunk({ reasoning_content: 'Let me ' }) +
          chunk({ reasoning_content: 'think.' }) + chunk({ content: 'The **answer**.' }) + chunk({}, 'stop') +
          'data: ' + JSON.stringify({ choices: [], usage: { prompt_tokens: 9, completion_tokens: 7, total_tokens: 16 } }) +
          '\n\ndata: [DONE]\n\n' }));
  await page.click('#new-chat');
  await ask('Think first.');
  await waitAnswered();
  const thought = await page.evaluate(() => {
    const all = document.querySelectorAll('#messages .msg.assistant');
    const m = all[all.length - 1];
    const d = m.querySelector('details.reasoning');
    return { open: d ? d.open : null, reasoning: d ? d.querySelector('.md').textContent : null,
             content: m.querySelector('.content').textContent, strong: m.querySelector('.content strong')?.textContent };
  });
  await page.unroute('**/v1/chat/completions');
  check(thought.open === false && thought.reasoning === 'Let me think.' && thought.content === 'The answer.' &&
        thought.strong === 'answer', 'reasoning is shown collapsed, apart from the answer', JSON.stringify(thought));

  // ---- the status panel and the expert map
  const serverStatus = await api('/v1/status');
  const serverMap = await api('/v1/experts/map');
  await page.click('#toggle-status');
  await page.waitForFunction(() => document.getElementById('status-model-name')?.textContent.length > 0 &&
                                   Number(document.getElementById('expert-map').dataset.drawn || 0) > 0);
  check(await page.textContent('#status-model-name') === serverStatus.model.name, 'the status panel names the model',
        await page.textContent('#status-model-name'));
  await page.waitForFunction(() => /\d+(\.\d+)?%/.test(document.getElementById('hit-rate')?.textContent || ''));
  check(true, 'the status panel shows the expert cache hit rate: ' + await page.textContent('#hit-rate'));
  check(/tok\/s/.test(await page.textContent('#decode-speed')), 'the status panel shows the decode speed',
        await page.textContent('#decode-speed'));
  check((await page.textContent('#status-plan')).includes('memory plan'), 'the status panel shows the memory plan');

  const pixels = await page.evaluate(() => {
    const canvas = document.getElementById('expert-map');
    const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    const hex = getComputedStyle(document.documentElement).getPropertyValue('--map-bg').trim();
    const bg = [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
    const counts = { disk: 0, ram: 0, resident: 0, other: 0, background: 0 };
    for (let k = 0; k < d.length; k += 4) {
      const [r, g, b] = [d[k], d[k + 1], d[k + 2]];
      if (Math.abs(r - bg[0]) + Math.abs(g - bg[1]) + Math.abs(b - bg[2]) < 12) counts.background++;
      else if (b > r + 30 && b > g + 10) counts.disk++;           // blue
      else if (r > b + 40 && r >= g) counts.ram++;                // amber
      else if (g > r + 30 && g > b + 20) counts.resident++;       // green
      else counts.other++;
    }
    return counts;
  });
  const tiersDrawn = ['disk', 'ram', 'resident'].filter((t) => pixels[t] >= 50);
  const tiersInMap = new Set(serverMap.tier.flat().map((t) => serverMap.tiers[t]));
  check(serverMap.n_layer === 8 && serverMap.n_expert === 16, 'the map is 8 layers x 16 experts');
  check(tiersDrawn.length >= 2, 'the expert map shows at least two tier colours', JSON.stringify(pixels));
  check(tiersDrawn.every((t) => tiersInMap.has(t)), 'the colours drawn are tiers the server reports',
        `${JSON.stringify(pixels)} vs ${[...tiersInMap]}`);
  await page.hover('#expert-map', { position: { x: 28 + 3, y: 14 + 3 } });
  const tip = await page.textContent('#map-tip');
  check(await page.isVisible('#map-tip') && /^layer 0, expert 0: .*\d+ uses$/.test(tip),
        'hovering a cell tells its layer, expert, tier and uses', tip);
  await shot(page, 'webui-status.png');
  await shot(page.locator('#map-wrap'), 'webui-map.png');

  check(consoleErrors.length === 0, 'no console errors (CSP violations included)', consoleErrors.join(' | '));
  check(foreign.length === 0, 'the page requested nothing outside the server', foreign.join(' '));
} catch (e) {
  check(false, 'the browser session ran to the end', e && e.stack ? e.stack : String(e));
} finally {
  await browser.close();
}
for (const path of screenshots) console.log(`screenshot: ${path}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
