// sandboxd's dashboard: the node's API read with the root token, kept live
// by /v1/events (the op log and the VM view). Nothing here polls: a stream
// event says what changed and only that is read again; the one timer
// redraws ages and countdowns from times already known.
'use strict';

const TOKEN_KEY = 'sbx-dashboard-token';
const EVENTS_KEPT = 200;
const HISTORY_EVENTS = 50; // past events shown on load
const LATENCY_KEPT = 200;
const WARM_WINDOW_MS = 10 * 60 * 1000;
const ENDED = new Set(['released', 'expired', 'failed']);
const ENDING_EVENTS = new Set(['claim_released', 'claim_expired', 'claim_failed']);

const st = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  info: null,
  sandboxes: new Map(), // id -> Sandbox row
  vms: new Map(), // name -> VM
  created: new Map(), // claim id -> created time (ms), for latency
  latency: [], // {t, ms, tier}
  warm: [], // {t, counts: {pool: n}}
  baseSeq: 0, // the log sequence the first reads reflect
  abort: null,
};

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// api reads one route; a 401 or 403 sends the user back to the login form.
async function api(path) {
  const resp = await fetch(path, { headers: { Authorization: 'Bearer ' + st.token }, signal: st.abort.signal });
  if (resp.status === 401 || resp.status === 403) {
    logout('This token is not the node\'s root token.');
    throw new Error('unauthorised');
  }
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

// stream reads a Server-Sent Events route with the bearer token (an
// EventSource cannot send one) and calls onEvent(type, id, data) per
// event and onComment() per comment (the heartbeat). When the stream ends
// it connects again after a second, to url(lastID) (lastID: the last event
// id seen, '' for none).
async function stream(url, onEvent, onComment) {
  const signal = st.abort.signal;
  let last = '';
  while (!signal.aborted) {
    try {
      const resp = await fetch(url(last), { headers: { Authorization: 'Bearer ' + st.token, Accept: 'text/event-stream' }, signal });
      if (resp.status === 401 || resp.status === 403) {
        logout('This token is not the node\'s root token.');
        return;
      }
      if (!resp.ok) throw new Error(resp.statusText);
      setLive(true);
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let at;
        while ((at = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, at);
          buf = buf.slice(at + 2);
          let type = 'message', id = '', data = '';
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) { if (onComment) onComment(); continue; }
            const colon = line.indexOf(':');
            const field = colon < 0 ? line : line.slice(0, colon);
            const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
            if (field === 'event') type = val;
            else if (field === 'id') id = val;
            else if (field === 'data') data += (data ? '\n' : '') + val;
          }
          if (type === 'error') last = 'end'; // the cursor cannot be served: go on from the end
          else if (id) last = id;
          if (data) onEvent(type, id, JSON.parse(data));
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    setLive(false);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function setLive(on) {
  const b = $('#live');
  b.textContent = on ? 'live' : 'reconnecting';
  b.className = 'badge ' + (on ? 'on' : 'off');
}

// coalesce runs fn at most once at a time; calls during a run make one more.
function coalesce(fn) {
  let running = false, again = false;
  return async function run() {
    if (running) { again = true; return; }
    running = true;
    try { await fn(); } catch (err) { /* the next event tries again */ }
    running = false;
    if (again) { again = false; run(); }
  };
}

const refreshInfo = coalesce(async () => {
  st.info = await api('/v1/info');
  renderInfo();
});

const pendingRows = new Set();
const refreshRows = coalesce(async () => {
  const ids = [...pendingRows];
  pendingRows.clear();
  for (const id of ids) {
    const row = await api('/v1/sandboxes/' + encodeURIComponent(id));
    if (ENDED.has(row.state) || !row.state) st.sandboxes.delete(id);
    else st.sandboxes.set(id, row);
  }
  renderSandboxes();
});

// onLogEvent folds one op-log event into the board.
function onLogEvent(type, id, ev) {
  if (type === 'error' || !ev.seq) {
    addNote('event stream: ' + (ev.error || type));
    return;
  }
  addEvent(ev);
  const agg = ev.aggregate || {};
  const t = Date.parse(ev.time);
  if (type === 'claim_created') {
    st.created.set(agg.id, t);
    if (ev.payload && ev.payload.tier === 'warm') addLatency(t, 0, 'warm');
  } else if (type === 'claim_served' && st.created.has(agg.id)) {
    addLatency(t, t - st.created.get(agg.id), 'served');
  }
  if (ev.seq <= st.baseSeq) return; // history: the first reads already hold it
  if (agg.kind === 'claim') {
    if (ENDING_EVENTS.has(type)) {
      st.sandboxes.delete(agg.id);
      renderSandboxes();
    } else if (type !== 'claim_touched' && type !== 'relay_opened' && type !== 'relay_closed' && type !== 'egress_usage') {
      pendingRows.add(agg.id);
      refreshRows();
    }
  }
  if (agg.kind === 'pool' || agg.kind === 'golden' || agg.kind === 'node' || agg.kind === 'vm' || type === 'claim_created' || ENDING_EVENTS.has(type)) {
    refreshInfo();
  }
}

function addEvent(ev) {
  const list = $('#events');
  const agg = ev.aggregate || {};
  list.prepend(el('li', { 'data-seq': ev.seq },
    el('span', { class: 'seq' }, ev.seq),
    el('span', { class: 'type' }, ev.type),
    `${agg.kind} ${agg.id}  ${new Date(ev.time).toLocaleTimeString()}`));
  while (list.children.length > EVENTS_KEPT) list.lastChild.remove();
}

function addNote(text) {
  $('#events').prepend(el('li', { class: 'error' }, text));
}

function addLatency(t, ms, tier) {
  st.latency.push({ t, ms, tier });
  if (st.latency.length > LATENCY_KEPT) st.latency.shift();
  renderLatency();
}

// onVMEvent folds the VM view: a sync, then changes.
function onVMEvent(type, id, data) {
  if (type === 'sync') {
    st.vms = new Map((data.vms || []).map((v) => [v.name, v]));
  } else if (type === 'change') {
    if (data.type === 'DELETED') st.vms.delete(data.vm.name);
    else st.vms.set(data.vm.name, data.vm);
  } else {
    return;
  }
  const counts = {};
  for (const v of st.vms.values()) if (v.state === 'warm') counts[v.pool] = (counts[v.pool] || 0) + 1;
  const now = Date.now();
  st.warm.push({ t: now, counts });
  while (st.warm.length > 2 && st.warm[1].t < now - WARM_WINDOW_MS) st.warm.shift();
  renderVMs();
  renderWarm();
}

const poolName = (k) => k ? `${k.template}/${k.net}/${k.size}` : '';

function dur(ms) {
  if (!isFinite(ms)) return '';
  const neg = ms < 0;
  let s = Math.abs(Math.round(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  s %= 60;
  const out = h ? `${h}h${String(m).padStart(2, '0')}m` : m ? `${m}m${String(s).padStart(2, '0')}s` : `${s}s`;
  return neg ? '-' + out : out;
}

function renderInfo() {
  const i = st.info;
  if (!i) return;
  $('#node').textContent = `${i.node} · ${i.owner_addr} · ${i.hypervisor}${i.draining ? ' · draining' : ''}`;
  const pools = $('#pools tbody');
  pools.replaceChildren(...i.pools.map((p) => el('tr', { 'data-pool': poolName(p.key) },
    el('td', {}, poolName(p.key)),
    el('td', { class: 'num' }, p.warm),
    el('td', { class: 'num' }, p.target),
    el('td', { class: 'num' }, p.refilling),
    el('td', { class: 'num' }, p.live),
    el('td', { class: 'golden-' + p.golden_state }, p.golden_state),
    el('td', {}, [p.draining && 'draining', p.at_capacity && 'at capacity'].filter(Boolean).join(', ')))));
  renderReplication(i.replication);
}

function renderReplication(r) {
  const box = $('#replication');
  const nodes = $('#nodes tbody');
  if (!r) {
    box.replaceChildren(el('p', { class: 'hint' }, 'Replication is off (-no-nats): this node is the only one.'));
    nodes.replaceChildren(el('tr', {}, el('td', {}, st.info.node), el('td', {}, st.info.owner_addr),
      el('td', { class: 'num' }, st.info.log_seq), el('td', { class: 'num' }, st.info.live), el('td', {}, ''), el('td', {}, 'this node')));
    return;
  }
  const rep = r.replicator || {};
  const dl = el('dl', {});
  const kv = [['NATS', `${r.url}${r.embedded ? ' (embedded)' : ''}`], ['stream', r.stream], ['replicator', rep.state],
    ['replicated', `${rep.replicated}${rep.confirmed ? '' : ' (unconfirmed)'}`], ['pending', rep.pending],
    ['last error', rep.last_error || '—']];
  for (const [k, v] of Object.entries(r.stopped || {})) kv.push(['stopped: ' + k, v]);
  for (const [k, v] of kv) dl.append(el('dt', {}, k), el('dd', {}, v === undefined ? '' : v));
  box.replaceChildren(dl);
  const addr = new Map((r.addresses || []).map((a) => [a.node, a.addr]));
  nodes.replaceChildren(...(r.nodes || []).map((n) => el('tr', { 'data-node': n.node },
    el('td', {}, n.node + (n.node === st.info.node ? ' (this)' : '')),
    el('td', {}, addr.get(n.node) || ''),
    el('td', { class: 'num' }, n.applied),
    el('td', { class: 'num' }, n.live),
    el('td', {}, Object.entries(n.warm || {}).map(([k, w]) => `${k}: ${w}`).join(', ')),
    el('td', { class: n.broken ? 'broken' : '' }, n.broken || 'ok'))));
}

function renderSandboxes() {
  const rows = [...st.sandboxes.values()].sort((a, b) => (a.created < b.created ? 1 : -1));
  const now = Date.now();
  $('#sandbox-count').textContent = `${rows.length} live`;
  $('#sandboxes tbody').replaceChildren(...rows.map((s) => el('tr', { 'data-id': s.id, 'data-state': s.state },
    el('td', {}, s.id),
    el('td', {}, poolName(s.key)),
    el('td', { class: 'state-' + s.state }, s.state),
    el('td', {}, s.tier),
    el('td', {}, s.tenant || ''),
    el('td', { class: 'num' }, dur(now - Date.parse(s.created))),
    el('td', { class: 'num' }, dur(Date.parse(s.deadline) - now)),
    el('td', {}, s.vm || ''))));
}

function renderVMs() {
  const byState = {};
  for (const v of st.vms.values()) byState[v.state] = (byState[v.state] || 0) + 1;
  $('#vm-summary').textContent = Object.entries(byState).map(([k, n]) => `${k} ${n}`).join(' · ') || 'no VMs';
  const vms = [...st.vms.values()].filter((v) => v.live).sort((a, b) => (a.name < b.name ? -1 : 1));
  $('#vms tbody').replaceChildren(...vms.map((v) => el('tr', { 'data-vm': v.name },
    el('td', {}, v.name), el('td', {}, v.pool), el('td', { class: 'vm-' + v.state }, v.state), el('td', {}, v.claim || ''))));
}

const COLORS = ['#2b6cb0', '#1f8a4c', '#b7791f', '#9f3a9f', '#c53030', '#2c7a7b'];
const W = 480, H = 180, L = 40, R = 10, T = 10, B = 22;

// axes draws the frame and the y scale of a plot, and returns its y mapper.
function axes(plot, ymax, unit) {
  plot.replaceChildren();
  plot.append(svg('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
  plot.append(svg('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
  const y = (v) => H - B - (v / ymax) * (H - B - T);
  for (const v of [0, ymax / 2, ymax]) {
    plot.append(svg('text', { x: L - 4, y: y(v) + 3, 'text-anchor': 'end' }, `${+v.toFixed(1)}${unit}`));
  }
  return y;
}

function renderLatency() {
  const plot = $('#latency-plot');
  const pts = st.latency;
  const ymax = Math.max(10, ...pts.map((p) => p.ms)) * 1.1;
  const y = axes(plot, ymax, 'ms');
  const n = Math.max(pts.length, 1);
  const x = (i) => L + ((i + 0.5) / n) * (W - L - R);
  pts.forEach((p, i) => plot.append(svg('circle', {
    cx: x(i).toFixed(1), cy: y(p.ms).toFixed(1), r: 3, fill: p.tier === 'warm' ? COLORS[1] : COLORS[2],
  }, undefined)));
  plot.append(svg('text', { x: L + 4, y: H - 6 }, `${pts.length} claims, oldest left`));
  plot.append(svg('text', { x: W - R, y: H - 6, 'text-anchor': 'end', fill: COLORS[1] }, '● warm'));
  plot.append(svg('text', { x: W - R - 50, y: H - 6, 'text-anchor': 'end', fill: COLORS[2] }, '● clone/cold'));
}

function renderWarm() {
  const plot = $('#warm-plot');
  const samples = st.warm;
  const pools = [...new Set(samples.flatMap((s) => Object.keys(s.counts)))].sort();
  const ymax = Math.max(2, ...samples.flatMap((s) => Object.values(s.counts)));
  const y = axes(plot, ymax, '');
  const now = Date.now(), t0 = now - WARM_WINDOW_MS;
  const x = (t) => L + (Math.max(t, t0) - t0) / WARM_WINDOW_MS * (W - L - R);
  pools.forEach((pool, i) => {
    let d = '', prev = null;
    for (const s of samples) {
      const v = s.counts[pool] || 0;
      d += prev === null ? `M${x(s.t).toFixed(1)},${y(v).toFixed(1)}` : `H${x(s.t).toFixed(1)}V${y(v).toFixed(1)}`;
      prev = v;
    }
    d += `H${x(now).toFixed(1)}`;
    plot.append(svg('path', { d, fill: 'none', stroke: COLORS[i % COLORS.length], 'stroke-width': 2 }));
    plot.append(svg('text', { x: L + 6, y: T + 10 + 12 * i, fill: COLORS[i % COLORS.length] }, pool));
  });
  plot.append(svg('text', { x: L + 4, y: H - 6 }, '-10 min'));
  plot.append(svg('text', { x: W - R, y: H - 6, 'text-anchor': 'end' }, 'now'));
}

async function start() {
  st.abort = new AbortController();
  $('#login').hidden = true;
  $('#board').hidden = false;
  $('#logout').hidden = false;
  try {
    st.info = await api('/v1/info');
    st.baseSeq = st.info.log_seq;
    renderInfo();
    const list = await api('/v1/sandboxes');
    st.sandboxes = new Map(list.sandboxes.map((s) => [s.id, s]));
  } catch (err) {
    if (!st.abort.signal.aborted) addNote('reading the node failed: ' + (err.message || err));
    return;
  }
  renderSandboxes();
  renderLatency();
  renderWarm();
  const from = Math.max(1, st.baseSeq - HISTORY_EVENTS + 1);
  stream((last) => '/v1/events' + (last === 'end' ? '' : '?from=' + (last ? Number(last) + 1 : from)), onLogEvent, refreshInfo);
  stream(() => '/v1/events?view=vms', onVMEvent);
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  st.token = '';
  if (st.abort) st.abort.abort();
  $('#board').hidden = true;
  $('#logout').hidden = true;
  $('#login').hidden = false;
  $('#login-error').textContent = msg || '';
  setLive(false);
  $('#live').textContent = 'offline';
}

document.addEventListener('DOMContentLoaded', () => {
  $('#login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    st.token = $('#token').value.trim();
    sessionStorage.setItem(TOKEN_KEY, st.token);
    $('#login-error').textContent = '';
    start();
  });
  $('#logout').addEventListener('click', () => logout(''));
  // Ages and countdowns move with the clock, from times already read.
  setInterval(() => { if (st.sandboxes.size) renderSandboxes(); if (st.warm.length) renderWarm(); }, 1000);
  if (st.token) start(); else logout('');
});
