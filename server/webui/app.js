// Magnetar's web UI: chat over the server's own POST /v1/chat/completions (streamed), conversations and settings
// kept in localStorage, a status panel polling GET /v1/status and an expert map drawn from GET /v1/experts/map.
//
// Safety: text from the model or the user is never parsed as HTML. The markdown renderer builds DOM nodes and sets
// only textContent; links become <a> only for http(s) and mailto URLs, with rel="noopener noreferrer".
'use strict';

(() => {
  // ---- storage ---------------------------------------------------------------------------------------------------
  // localStorage keys. A conversation: {id, title, updated, messages: [{role, content, reasoning?, note?, error?}]}.
  const kConversationsKey = 'magnetar.conversations';
  const kCurrentKey = 'magnetar.current';
  const kSettingsKey = 'magnetar.settings';
  const kDefaultSettings = { system: '', temperature: '', top_p: '', top_k: '', max_tokens: '', thinking: false,
                             api_key: '' };
  const kStatusPollMs = 1000;

  const $ = (id) => document.getElementById(id);
  const el = (tag, className, text) => {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  function load(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v === null || v === undefined ? fallback : v;
    } catch (e) {
      return fallback;
    }
  }
  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      console.warn('magnetar: cannot save to localStorage:', e);
    }
  }

  const state = {
    conversations: load(kConversationsKey, []).filter((c) => c && Array.isArray(c.messages)),
    currentId: load(kCurrentKey, null),
    settings: Object.assign({}, kDefaultSettings, load(kSettingsKey, {})),
    live: null,  // the generation in flight: {conv, msg, controller}
    statusOpen: false,
    map: null,   // the last /v1/experts/map answer
  };
  const saveConversations = () => store(kConversationsKey, state.conversations);

  // fetch() with the API key of the settings (a server started with --api-key wants it) as a Bearer header.
  function apiFetch(url, options = {}) {
    const headers = Object.assign({}, options.headers || {});
    if (state.settings.api_key) headers['Authorization'] = 'Bearer ' + state.settings.api_key;
    return fetch(url, Object.assign({}, options, { headers }));
  }
  const kUnauthorized = 'the server wants an API key (it was started with --api-key): set it in Settings';
  // The JSON of a GET answer; a 401 becomes an Error saying where the key goes.
  async function getJson(url) {
    const r = await apiFetch(url);
    if (r.status === 401) throw Object.assign(new Error(kUnauthorized), { unauthorized: true });
    return r.json();
  }
  const current = () => state.conversations.find((c) => c.id === state.currentId) || null;
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  // ---- markdown: a small safe subset, built as DOM nodes ---------------------------------------------------------
  // Blocks: ``` / ~~~ fences (with a copy button), # headings, - * + and 1. lists (nested by indentation),
  // > quotes, --- rules, paragraphs (single newlines kept as line breaks). Inline: `code`, **bold**, *italic*,
  // _italic_, ~~strike~~, [text](url), backslash escapes.
  const kFence = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
  const kHeading = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
  const kRule = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const kQuote = /^ {0,3}>\s?/;
  const kItem = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const indentOf = (line) => line.match(/^\s*/)[0].replace(/\t/g, '    ').length;
  const startsBlock = (line) => kFence.test(line) || kHeading.test(line) || kRule.test(line) || kQuote.test(line) ||
                                kItem.test(line);

  function renderMarkdown(src, parent) {
    const lines = src.replace(/\r\n?/g, '\n').split('\n');
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (/^\s*$/.test(line)) {
        i++;
      } else if ((m = kFence.exec(line))) {
        const fence = m[1];
        const body = [];
        for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) body.push(lines[i]);
        i++;  // the closing fence (or the end of a text still streaming)
        parent.appendChild(codeBlock(body.join('\n'), m[2]));
      } else if ((m = kHeading.exec(line))) {
        const h = el('h' + m[1].length);
        renderInline(m[2], h);
        parent.appendChild(h);
        i++;
      } else if (kRule.test(line)) {
        parent.appendChild(el('hr'));
        i++;
      } else if (kQuote.test(line)) {
        const body = [];
        for (; i < lines.length && kQuote.test(lines[i]); i++) body.push(lines[i].replace(kQuote, ''));
        const q = el('blockquote');
        renderMarkdown(body.join('\n'), q);
        parent.appendChild(q);
      } else if ((m = kItem.exec(line))) {
        i = renderList(lines, i, parent);
      } else {
        const body = [line];
        for (i++; i < lines.length && !/^\s*$/.test(lines[i]) && !startsBlock(lines[i]); i++) body.push(lines[i]);
        const p = el('p');
        renderInline(body.join('\n'), p);
        parent.appendChild(p);
      }
    }
  }

  // A list starting at lines[start]; returns the index of the first line after it. An item holds the lines indented
  // deeper than its marker (its continuation and nested lists); a blank line followed by such a line stays inside.
  function renderList(lines, start, parent) {
    const first = kItem.exec(lines[start]);
    const base = indentOf(first[1]);
    const ordered = /\d/.test(first[2]);
    const list = el(ordered ? 'ol' : 'ul');
    if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
    let i = start;
    while (i < lines.length) {
      const m = kItem.exec(lines[i]);
      if (!m || indentOf(m[1]) !== base || /\d/.test(m[2]) !== ordered) break;
      const body = [m[3]];
      for (i++; i < lines.length; i++) {
        const line = lines[i];
        if (/^\s*$/.test(line)) {
          if (i + 1 < lines.length && indentOf(lines[i + 1]) > base && !/^\s*$/.test(lines[i + 1])) {
            body.push('');
            continue;
          }
          break;
        }
        const deeper = indentOf(line) > base;
        if (!deeper && (kItem.test(line) || startsBlock(line))) break;
        body.push(deeper ? line.replace(/^\s+/, (s) => s.slice(Math.min(s.length, base + 2))) : line);
      }
      const li = el('li');
      if (body.length === 1) {
        renderInline(body[0], li);
      } else {
        renderMarkdown(body.join('\n'), li);
      }
      list.appendChild(li);
    }
    parent.appendChild(list);
    return i;
  }

  function codeBlock(text, lang) {
    const box = el('div', 'code');
    const head = el('div', 'code-head');
    head.appendChild(el('span', 'lang', lang || 'text'));
    const copy = el('button', 'copy', 'Copy');
    copy.type = 'button';
    copy.addEventListener('click', () => copyText(text, copy));
    head.appendChild(copy);
    const pre = el('pre');
    pre.appendChild(el('code', lang ? 'language-' + lang.replace(/[^\w+#.-]/g, '') : '', text));
    box.appendChild(head);
    box.appendChild(pre);
    return box;
  }

  function copyText(text, button) {
    const done = (ok) => {
      button.textContent = ok ? 'Copied' : 'Copy failed';
      setTimeout(() => { button.textContent = 'Copy'; }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(() => done(true), () => done(fallbackCopy(text)));
    } else {
      done(fallbackCopy(text));
    }
  }
  function fallbackCopy(text) {
    const area = el('textarea');
    area.value = text;
    document.body.appendChild(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand('copy');
    } catch (e) {
      ok = false;
    }
    area.remove();
    return ok;
  }

  const kSafeUrl = /^(https?:\/\/|mailto:)/i;

  function renderInline(text, parent) {
    let buf = '';
    const flush = () => {
      if (buf) parent.appendChild(document.createTextNode(buf));
      buf = '';
    };
    let i = 0;
    while (i < text.length) {
      const c = text[i];
      if (c === '\\' && i + 1 < text.length && /[\\`*_{}[\]()#+\-.!>~|]/.test(text[i + 1])) {
        buf += text[i + 1];
        i += 2;
        continue;
      }
      if (c === '\n') {
        flush();
        parent.appendChild(el('br'));
        i++;
        continue;
      }
      if (c === '`') {
        let n = 1;
        while (text[i + n] === '`') n++;
        const ticks = '`'.repeat(n);
        const end = text.indexOf(ticks, i + n);
        if (end > i + n - 1 && text[end + n] !== '`') {
          flush();
          let code = text.slice(i + n, end);
          if (/^ .* $/.test(code)) code = code.slice(1, -1);
          parent.appendChild(el('code', '', code));
          i = end + n;
          continue;
        }
        buf += ticks;
        i += n;
        continue;
      }
      if (c === '[') {
        const m = /^\[([^\]\n]+)\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"\n]*")?\s*\)/.exec(text.slice(i));
        if (m) {
          flush();
          if (kSafeUrl.test(m[2])) {
            const a = el('a');
            a.href = m[2];
            a.rel = 'noopener noreferrer nofollow';
            a.target = '_blank';
            renderInline(m[1], a);
            parent.appendChild(a);
          } else {
            renderInline(m[1], parent);  // an unsafe or relative URL: the text only
          }
          i += m[0].length;
          continue;
        }
      }
      if (c === '*' || c === '_' || (c === '~' && text[i + 1] === '~')) {
        const n = c === '~' ? 2 : (text[i + 1] === c ? 2 : 1);
        const delim = c.repeat(n);
        const prev = i > 0 ? text[i - 1] : ' ';
        const next = text[i + n] || ' ';
        // An opening delimiter is followed by a non-space; `_` must not sit inside a word (snake_case).
        const opens = !/\s/.test(next) && !(c === '_' && /\w/.test(prev));
        if (opens) {
          let end = i + n;
          for (;;) {
            end = text.indexOf(delim, end);
            if (end < 0) break;
            const before = text[end - 1];
            const after = text[end + n] || ' ';
            if (end > i + n && !/\s/.test(before) && !(c === '_' && /\w/.test(after)) && after !== c) break;
            end += 1;
          }
          if (end > 0) {
            flush();
            const tag = c === '~' ? 'del' : n === 2 ? 'strong' : 'em';
            const e = el(tag);
            renderInline(text.slice(i + n, end), e);
            parent.appendChild(e);
            i = end + n;
            continue;
          }
        }
        buf += delim;
        i += n;
        continue;
      }
      buf += c;
      i++;
    }
    flush();
  }

  // ---- conversations: the list and the messages ------------------------------------------------------------------

  const msgElements = new WeakMap();  // message -> its element while shown

  function renderConversationList() {
    const ul = $('conversations');
    ul.replaceChildren();
    const sorted = [...state.conversations].sort((a, b) => (b.updated || 0) - (a.updated || 0));
    for (const conv of sorted) {
      const li = el('li', conv.id === state.currentId ? 'current' : '');
      li.dataset.id = conv.id;
      li.title = conv.title || 'New chat';
      li.appendChild(el('span', 'title', conv.title || 'New chat'));
      const del = el('button', 'delete', '×');
      del.type = 'button';
      del.title = 'Delete this conversation';
      del.setAttribute('aria-label', 'Delete conversation');
      del.addEventListener('click', (ev) => {
        ev.stopPropagation();
        deleteConversation(conv.id);
      });
      li.appendChild(del);
      li.addEventListener('click', () => switchTo(conv.id));
      ul.appendChild(li);
    }
  }

  function fillMessage(div, msg, streaming) {
    div.className = 'msg ' + msg.role + (streaming ? ' streaming' : '');
    div.replaceChildren();
    div.appendChild(el('div', 'role', msg.role === 'user' ? 'You' : 'Assistant'));
    if (msg.reasoning) {
      const details = el('details', 'reasoning');
      const summary = el('summary', '', streaming && !msg.content ? 'Thinking…' :
                                           `Reasoning (${msg.reasoning.length} characters)`);
      details.appendChild(summary);
      const body = el('div', 'md');
      renderMarkdown(msg.reasoning, body);
      details.appendChild(body);
      div.appendChild(details);
    }
    const content = el('div', 'content md');
    if (msg.role === 'user') {
      content.appendChild(el('p', 'plain', msg.content));  // what the user typed, as typed
    } else {
      renderMarkdown(msg.content || '', content);
    }
    div.appendChild(content);
    if (msg.error) div.appendChild(el('div', 'note error', msg.error));
    if (msg.note) div.appendChild(el('div', 'note', msg.note));
  }

  function renderMessages() {
    const box = $('messages');
    box.replaceChildren();
    const conv = current();
    if (!conv || conv.messages.length === 0) {
      box.appendChild(el('div', 'empty', 'Send a message to start a conversation.'));
      return;
    }
    for (const msg of conv.messages) {
      const div = el('div');
      fillMessage(div, msg, state.live && state.live.msg === msg);
      msgElements.set(msg, div);
      box.appendChild(div);
    }
    box.scrollTop = box.scrollHeight;
  }

  function updateMessage(msg, streaming) {
    const div = msgElements.get(msg);
    if (!div || !div.isConnected) return;
    const box = $('messages');
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    fillMessage(div, msg, streaming);
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function switchTo(id) {
    state.currentId = id;
    store(kCurrentKey, id);
    renderConversationList();
    renderMessages();
  }

  function newConversation() {
    const conv = { id: newId(), title: '', updated: Date.now(), messages: [] };
    state.conversations.push(conv);
    saveConversations();
    switchTo(conv.id);
    $('input').focus();
    return conv;
  }

  function deleteConversation(id) {
    if (state.live && state.live.conv.id === id) state.live.controller.abort();
    state.conversations = state.conversations.filter((c) => c.id !== id);
    saveConversations();
    if (state.currentId === id) {
      const next = [...state.conversations].sort((a, b) => (b.updated || 0) - (a.updated || 0))[0];
      state.currentId = next ? next.id : null;
      store(kCurrentKey, state.currentId);
    }
    renderConversationList();
    renderMessages();
  }

  // ---- chat: one streamed request at a time ----------------------------------------------------------------------

  function setBusy(busy) {
    $('send').hidden = busy;
    $('stop').hidden = !busy;
    $('send').disabled = busy;
  }

  // The request body: the system prompt, the conversation's turns (reasoning left out, as chat templates drop it
  // from history) and the settings that are set.
  function requestBody(conv, upTo) {
    const s = state.settings;
    const messages = [];
    if (s.system.trim()) messages.push({ role: 'system', content: s.system });
    for (const m of conv.messages.slice(0, upTo)) {
      if (m.role === 'assistant' && !m.content) continue;
      messages.push({ role: m.role, content: m.content });
    }
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    const num = (v, int) => {
      if (v === '' || v === null || v === undefined) return undefined;
      const n = int ? parseInt(v, 10) : parseFloat(v);
      return Number.isFinite(n) ? n : undefined;
    };
    const fields = { temperature: num(s.temperature), top_p: num(s.top_p), top_k: num(s.top_k, true),
                     max_tokens: num(s.max_tokens, true) };
    for (const [k, v] of Object.entries(fields)) {
      if (v !== undefined) body[k] = v;
    }
    // Thinking is off unless asked for (the server renders Qwen3's template with enable_thinking false).
    if (s.thinking) body.chat_template_kwargs = { enable_thinking: true };
    return body;
  }

  async function send(text) {
    if (state.live) return;
    let conv = current();
    if (!conv) conv = newConversation();
    conv.messages.push({ role: 'user', content: text });
    if (!conv.title) conv.title = text.replace(/\s+/g, ' ').slice(0, 60);
    const msg = { role: 'assistant', content: '', reasoning: '' };
    conv.messages.push(msg);
    conv.updated = Date.now();
    saveConversations();
    const controller = new AbortController();
    state.live = { conv, msg, controller };
    setBusy(true);
    renderConversationList();
    renderMessages();

    const started = performance.now();
    let usage = null;
    let finish = null;
    let frame = 0;  // the pending requestAnimationFrame render of the streamed message, 0 when none
    try {
      const res = await apiFetch('/v1/chat/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(requestBody(conv, conv.messages.length - 1)),
        signal: controller.signal,
      });
      if (!res.ok) {
        let message = `HTTP ${res.status}`;
        try {
          const j = await res.json();
          if (j && j.error && j.error.message) message += ': ' + j.error.message;
        } catch (e) { /* not JSON */ }
        if (res.status === 401) message += ' (' + kUnauthorized + ')';
        throw new Error(message);
      }
      // SSE: events separated by a blank line; `data: JSON` lines, `data: [DONE]` at the end, `:` comments
      // (keep-alives during a long prompt) ignored.
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let pending = '';
      let done = false;
      while (!done) {
        const { value, done: eof } = await reader.read();
        if (eof) break;
        pending += decoder.decode(value, { stream: true });
        let cut;
        let changed = false;
        while ((cut = pending.search(/\r?\n\r?\n/)) >= 0) {
          const event = pending.slice(0, cut);
          pending = pending.slice(cut).replace(/^\r?\n\r?\n/, '');
          for (const line of event.split(/\r?\n/)) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (data === '[DONE]') {
              done = true;
              break;
            }
            const j = JSON.parse(data);
            if (j.error) throw new Error(j.error.message || 'the server reported an error');
            if (j.usage) usage = j.usage;
            const choice = j.choices && j.choices[0];
            if (!choice) continue;
            const delta = choice.delta || {};
            if (typeof delta.reasoning_content === 'string') msg.reasoning += delta.reasoning_content;
            if (typeof delta.content === 'string') msg.content += delta.content;
            if (choice.finish_reason) finish = choice.finish_reason;
            changed = true;
          }
        }
        // One render per frame: a message is rendered whole, and tokens can arrive far faster than frames.
        if (changed && !frame)
          frame = requestAnimationFrame(() => {
            frame = 0;
            updateMessage(msg, true);
          });
      }
      const seconds = (performance.now() - started) / 1000;
      const parts = [];
      if (usage) parts.push(`${usage.completion_tokens} tokens in ${seconds.toFixed(1)} s`);
      if (finish === 'length') parts.push('stopped at max_tokens');
      msg.note = parts.join(' · ');
    } catch (e) {
      if (controller.signal.aborted) {
        msg.note = 'stopped';
        msg.stopped = true;
      } else {
        msg.error = String(e && e.message ? e.message : e);
      }
    } finally {
      cancelAnimationFrame(frame);
      state.live = null;
      conv.updated = Date.now();
      saveConversations();
      setBusy(false);
      updateMessage(msg, false);
      pollStatus();
    }
  }

  // ---- settings ----------------------------------------------------------------------------------------------------

  const kSettingFields = { system: 'system-prompt', temperature: 'temperature', top_p: 'top-p', top_k: 'top-k',
                           max_tokens: 'max-tokens', api_key: 'api-key' };
  function showSettings() {
    for (const [k, id] of Object.entries(kSettingFields)) $(id).value = state.settings[k] ?? '';
    $('thinking').checked = Boolean(state.settings.thinking);
  }
  function bindSettings() {
    for (const [k, id] of Object.entries(kSettingFields)) {
      $(id).addEventListener('input', () => {
        state.settings[k] = $(id).value;
        store(kSettingsKey, state.settings);
      });
    }
    $('thinking').addEventListener('change', () => {
      state.settings.thinking = $('thinking').checked;
      store(kSettingsKey, state.settings);
    });
    $('reset-settings').addEventListener('click', () => {
      // The API key is not a sampling default: it stays.
      state.settings = Object.assign({}, kDefaultSettings, { api_key: state.settings.api_key });
      store(kSettingsKey, state.settings);
      showSettings();
    });
  }

  function togglePanel(which) {
    const panels = { settings: ['settings-panel', 'toggle-settings'], status: ['status-panel', 'toggle-status'] };
    for (const [name, [panel, button]] of Object.entries(panels)) {
      const open = name === which && $(panel).hidden;
      $(panel).hidden = !open;
      $(button).setAttribute('aria-pressed', String(open));
    }
    state.statusOpen = !$('status-panel').hidden;
    if (state.statusOpen) pollStatus();
  }

  // ---- status ------------------------------------------------------------------------------------------------------

  const fmtInt = (n) => Number(n).toLocaleString('en-US');
  const fmtPct = (r) => (r === null || r === undefined ? '–' : (100 * r).toFixed(1) + '%');
  const fmtBytes = (b) => {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Number(b);
    let u = 0;
    while (v >= 1024 && u < units.length - 1) {
      v /= 1024;
      u++;
    }
    return (u === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + units[u];
  };
  const fmtCount = (n) => {
    n = Number(n);
    if (n >= 1e9) return (n / 1e9).toFixed(2) + ' B';
    if (n >= 1e6) return (n / 1e6).toFixed(2) + ' M';
    if (n >= 1e3) return (n / 1e3).toFixed(1) + ' k';
    return String(n);
  };

  function facts(dl, rows) {
    dl.replaceChildren();
    for (const [label, value, id] of rows) {
      dl.appendChild(el('dt', '', label));
      const dd = el('dd', '', value);
      if (id) dd.id = id;
      dl.appendChild(dd);
    }
  }

  function showStatus(s) {
    const m = s.model;
    $('model-name').textContent = m.id || m.name;
    const w = s.worker;
    $('speed').textContent = w.last_generated_tokens > 0 ?
        `${w.decode_tokens_per_second.toFixed(1)} tok/s` + (w.active ? ' (generating)' : '') : '';
    if (!state.statusOpen) return;
    facts($('status-model'), [
      ['model', m.name || m.id, 'status-model-name'],
      ['architecture', m.architecture],
      ['parameters', fmtCount(m.n_params)],
      ['layers', String(m.n_layer)],
      ['experts', m.n_expert ? `${m.n_expert} per layer, ${m.n_expert_used} per token` : 'dense'],
      ['context', fmtInt(m.n_ctx) + ' tokens'],
      ['file', `${m.path} (${fmtBytes(m.file_bytes)})`],
    ]);
    const e = s.experts;
    const kv = s.kv_disk;
    const rows = [
      ['decode speed', w.last_generated_tokens > 0 ?
          `${w.decode_tokens_per_second.toFixed(1)} tok/s (${fmtInt(w.last_generated_tokens)} tokens, ` +
          `${w.last_generation_seconds.toFixed(2)} s)` : '–', 'decode-speed'],
      ['requests', `${w.active} running, ${w.queued} queued`],
      ['tokens', `${fmtInt(w.prompt_tokens)} prompt, ${fmtInt(w.generated_tokens)} generated`],
      ['KV reuse (RAM)', fmtPct(w.kv_reuse_rate) + ` of prompt tokens (${fmtInt(w.cached_tokens)})`, 'kv-reuse'],
    ];
    if (e.gpu_tier) {
      rows.push(['experts, GPU pool', `${fmtPct(e.gpu_hit_rate)} hit rate (${fmtInt(e.gpu_hits)} of ` +
                 `${fmtInt(e.gpu_lookups)}), ${fmtBytes(e.gpu_bytes_h2d)} copied up`]);
    }
    if (e.streamed) {
      rows.push(['experts, RAM cache', `${fmtPct(e.hit_rate)} hit rate (${fmtInt(e.hits)} of ${fmtInt(e.acquired)})`,
                 'hit-rate']);
      if (e.inflight_hits > 0) rows.push(['experts, in flight', fmtPct(e.inflight_hit_rate) + ' (prefetched)']);
      rows.push(['experts, disk', `${fmtPct(e.acquired ? e.misses / e.acquired : null)} missed: ` +
                 `${fmtInt(e.reads)} reads, ${fmtBytes(e.bytes_read)}`]);
      rows.push(['experts now', (e.gpu_tier ? `${e.in_tier.gpu} on the GPU, ` : '') +
                 `${e.in_tier.ram} in RAM, ${e.in_tier.disk} on disk`]);
    } else {
      rows.push(['experts', m.n_expert ? '100.0% resident (mapped in RAM)' : 'no routed experts', 'hit-rate']);
    }
    if (kv.enabled) {
      rows.push(['KV on disk', `${fmtInt(kv.tokens_restored)} tokens restored, ${fmtInt(kv.blocks_on_disk)} blocks ` +
                 `(${fmtBytes(kv.bytes_on_disk)})`]);
    } else {
      rows.push(['KV on disk', 'off']);
    }
    facts($('status-numbers'), rows);
    $('status-plan').textContent = s.plan || '(resident: no plan printed)';
  }

  let polling = false;
  async function pollStatus() {
    if (polling || document.visibilityState === 'hidden') return;
    polling = true;
    try {
      const [status, map] = await Promise.all([
        getJson('/v1/status'),
        state.statusOpen ? getJson('/v1/experts/map') : Promise.resolve(null),
      ]);
      showStatus(status);
      if (map) {
        state.map = map;
        drawMap();
      }
    } catch (e) {
      $('speed').textContent = e.unauthorized ? 'API key needed (Settings)' : 'server unreachable';
    } finally {
      polling = false;
    }
  }

  // ---- the expert map: rows = layers, columns = experts; colour = tier, brightness = log(uses) -------------------

  const kMapLeft = 28;  // room for layer labels
  const kMapTop = 14;   // room for expert labels
  let mapGeometry = null;

  function cssColor(name) {
    const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    const m = /^#([0-9a-f]{6})$/i.exec(v);
    const n = m ? parseInt(m[1], 16) : 0x808080;
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }

  function drawMap() {
    const map = state.map;
    const canvas = $('expert-map');
    const note = $('map-note');
    if (!map || !map.n_layer || !map.n_expert) {
      note.textContent = 'This model has no routed experts.';
      mapGeometry = null;
      return;
    }
    const width = Math.max(200, canvas.parentElement.clientWidth);
    const cell = Math.max(2, Math.floor((width - kMapLeft) / map.n_expert));
    const cellH = Math.max(3, Math.min(18, Math.round(cell * 0.8)));
    const height = kMapTop + cellH * map.n_layer + 2;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.height = height + 'px';
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const bg = cssColor('--map-bg');
    ctx.fillStyle = `rgb(${bg.join(',')})`;
    ctx.fillRect(0, 0, width, height);
    const colors = [cssColor('--tier-disk'), cssColor('--tier-ram'), cssColor('--tier-resident'),
                    cssColor('--tier-gpu')];
    let maxUses = 0;
    for (const row of map.uses) for (const u of row) maxUses = Math.max(maxUses, u);
    const gap = cell >= 6 ? 1 : 0;
    const counts = [0, 0, 0, 0];
    for (let l = 0; l < map.n_layer; l++) {
      for (let e = 0; e < map.n_expert; e++) {
        const t = map.tier[l][e];
        const u = map.uses[l][e];
        counts[t] = (counts[t] || 0) + 1;
        // Never-used experts stay visible (dim); the hottest is the tier colour itself.
        const b = u > 0 && maxUses > 0 ? 0.4 + 0.6 * Math.log1p(u) / Math.log1p(maxUses) : 0.25;
        const c = colors[t] || [128, 128, 128];
        ctx.fillStyle = `rgb(${Math.round(c[0] * b)},${Math.round(c[1] * b)},${Math.round(c[2] * b)})`;
        ctx.fillRect(kMapLeft + e * cell, kMapTop + l * cellH, cell - gap, cellH - gap);
      }
    }
    // Axis labels, sparse enough not to overlap.
    ctx.fillStyle = getComputedStyle(document.documentElement).getPropertyValue('--map-label').trim() || '#999';
    ctx.font = '9px sans-serif';
    ctx.textBaseline = 'middle';
    const layerStep = Math.max(1, Math.ceil(10 / cellH));
    for (let l = 0; l < map.n_layer; l += layerStep) ctx.fillText(String(l), 2, kMapTop + l * cellH + cellH / 2);
    ctx.textBaseline = 'alphabetic';
    const expertStep = Math.max(1, Math.ceil(18 / cell));
    for (let e = 0; e < map.n_expert; e += expertStep) ctx.fillText(String(e), kMapLeft + e * cell, kMapTop - 3);
    mapGeometry = { cell, cellH, width, height };
    canvas.dataset.drawn = String(Number(canvas.dataset.drawn || 0) + 1);
    note.textContent = `${map.n_layer} layers × ${map.n_expert} experts · ` +
        map.tiers.map((name, t) => `${counts[t] || 0} ${name}`).join(', ') + ` · hottest: ${fmtInt(maxUses)} uses`;
  }

  function mapHover(ev) {
    const tip = $('map-tip');
    const map = state.map;
    if (!map || !mapGeometry) return;
    const rect = ev.target.getBoundingClientRect();
    const x = ev.clientX - rect.left;
    const y = ev.clientY - rect.top;
    const e = Math.floor((x - kMapLeft) / mapGeometry.cell);
    const l = Math.floor((y - kMapTop) / mapGeometry.cellH);
    if (e < 0 || l < 0 || e >= map.n_expert || l >= map.n_layer) {
      tip.hidden = true;
      return;
    }
    const tierNames = { disk: 'on disk', ram: 'in the RAM cache', resident: 'resident', gpu: 'in the GPU pool' };
    const tier = map.tiers[map.tier[l][e]];
    tip.textContent = `layer ${l}, expert ${e}: ${tierNames[tier] || tier}, ${fmtInt(map.uses[l][e])} uses`;
    tip.hidden = false;
    const left = Math.min(x + 12, rect.width - tip.offsetWidth - 2);
    tip.style.left = Math.max(0, left) + 'px';
    tip.style.top = (y + 14) + 'px';
  }

  // ---- start -------------------------------------------------------------------------------------------------------

  function start() {
    if (state.currentId && !current()) state.currentId = null;
    if (!state.currentId && state.conversations.length > 0) {
      state.currentId = [...state.conversations].sort((a, b) => (b.updated || 0) - (a.updated || 0))[0].id;
    }
    showSettings();
    bindSettings();
    renderConversationList();
    renderMessages();
    setBusy(false);

    $('composer').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const text = $('input').value.trim();
      if (!text || state.live) return;
      $('input').value = '';
      send(text);
    });
    $('input').addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        $('composer').requestSubmit();
      }
    });
    $('stop').addEventListener('click', () => {
      if (state.live) state.live.controller.abort();
    });
    $('new-chat').addEventListener('click', () => {
      const conv = current();
      if (conv && conv.messages.length === 0) return $('input').focus();  // already a blank one
      newConversation();
    });
    $('toggle-settings').addEventListener('click', () => togglePanel('settings'));
    $('toggle-status').addEventListener('click', () => togglePanel('status'));
    $('expert-map').addEventListener('mousemove', mapHover);
    $('expert-map').addEventListener('mouseleave', () => { $('map-tip').hidden = true; });
    window.addEventListener('resize', () => { if (state.statusOpen) drawMap(); });
    window.addEventListener('storage', (ev) => {
      // Another tab changed the conversations: take its list (unless this tab is generating).
      if (ev.key === kConversationsKey && !state.live) {
        state.conversations = load(kConversationsKey, []);
        renderConversationList();
        renderMessages();
      }
    });
    pollStatus();
    setInterval(pollStatus, kStatusPollMs);
  }

  start();
})();
