// The operator console's script: the token (typed once, kept in sessionStorage once the
// node took it), the views the address's #fragment names (overview, events, one event, dead
// letters, a replay job), and every call to the JSON admin API under /admin/api/. It must
// never turn data into markup: every payload, header, key, error and answer reaches the page
// as text (textContent, text nodes, attribute values), never through an HTML parser.

const API = '/admin/api';
const TOKEN_KEY = 'hookgate.token';
const SVG = 'http://www.w3.org/2000/svg';

/** Overview refresh, and a running job's progress poll (milliseconds). */
const STATS_EVERY = 5000;
const JOB_EVERY = 500;

/** The chart's time axis: at least this many minutes, at most CHART_MAX. */
const CHART_MINUTES = 30;
const CHART_MAX = 60;

// Both lists must hold every name the node uses (claim::Status, claim::Path): a unit test in
// console.rs compares them.
const STATUSES = ['queued', 'in_progress', 'failed', 'dead', 'done'];
const PATHS = [
  'first_run', 'retry_after_failure', 'lease_retake', 'duplicate_done',
  'in_progress_elsewhere', 'duplicate_dead', 'payload_mismatch', 'queued',
  'duplicate_queued', 'store_unavailable', 'overloaded', 'replay', 'stale_completion',
  'paused', 'filtered',
];
const EVENT_FILTERS = [
  'provider', 'status', 'path', 'key_prefix', 'mode', 'reason',
  'created_after', 'created_before', 'updated_after', 'updated_before', 'limit',
];
const TIME_FILTERS = ['created_after', 'created_before', 'updated_after', 'updated_before'];

// ---------------------------------------------------------------------------------------
// Building the page: elements and text only.

/** An element with attributes (`class`, `on<event>` listeners, plain attributes) and
 *  children; strings become text nodes. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'class') node.className = value;
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(kind, value) {
  return el('span', { class: `badge ${kind}-${classWord(value)}` }, value ?? '—');
}

/** A class-safe word for a value the server named (a status, an outcome). */
function classWord(value) {
  return String(value ?? 'none').replace(/[^a-z_]/g, '');
}

function pathClass(path) {
  return PATHS.includes(path) ? `path-${path}` : 'path-other';
}

function when(rfc3339) {
  if (!rfc3339) return '—';
  const at = new Date(rfc3339);
  return Number.isNaN(at.getTime()) ? rfc3339 : localTime(at);
}

function whenUnix(seconds) {
  return seconds == null ? '—' : localTime(new Date(seconds * 1000));
}

function localTime(at) {
  const two = (n) => String(n).padStart(2, '0');
  return `${at.getFullYear()}-${two(at.getMonth() + 1)}-${two(at.getDate())} `
    + `${two(at.getHours())}:${two(at.getMinutes())}:${two(at.getSeconds())}`;
}

/** `datetime-local` text → Unix seconds (text), and back. */
function toUnix(local) {
  const ms = new Date(local).getTime();
  return Number.isNaN(ms) ? '' : String(Math.floor(ms / 1000));
}

function toLocalInput(unix) {
  if (!unix) return '';
  return localTime(new Date(Number(unix) * 1000)).replace(' ', 'T');
}

/** The console's address of one event. Each part is percent-encoded whole (`/`, `?`, `#`
 *  and `%` included), and a fragment is never normalized, so any key comes back as it is. */
function eventHref(provider, key) {
  return `#/event/${encodeURIComponent(provider)}/${encodeURIComponent(key)}`;
}

/** The API's address of one event (`action`: '' or '/replay'). The key goes in the query
 *  string, never the path: a browser collapses `.` and `..` path segments, percent-encoded
 *  or not, so `/events/stripe/..` would ask for `/events/`. */
function eventApiPath(provider, key, action = '', extra = {}) {
  return `/event${action}${query({ provider, key, ...extra })}`;
}

// ---------------------------------------------------------------------------------------
// The token and the API.

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }

  toString() {
    return `${this.status}${this.code ? ` ${this.code}` : ''}: ${this.message}`;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Calls the admin API with the kept token; a 401 forgets it and shows the token field. */
async function api(method, path, body) {
  try {
    return await call(method, path, body, token());
  } catch (err) {
    if (err.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin('The token was refused.');
    }
    throw err;
  }
}

/** One call to the admin API with `bearer` as the token; any failure is an ApiError
 *  (status 0: the node did not answer). */
async function call(method, path, body, bearer) {
  const headers = { Authorization: `Bearer ${bearer}`, Accept: 'application/json' };
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`${API}${path}`, init);
  } catch (err) {
    throw new ApiError(0, 'unreachable', `the node did not answer (${err.message})`);
  }
  // Errors raised before a handler runs (a query the API cannot read) come as plain text.
  const text = await response.text().catch(() => '');
  let data = null;
  try {
    data = JSON.parse(text);
  } catch {
    data = { message: text.slice(0, 300) };
  }
  if (response.status === 401) {
    throw new ApiError(401, 'unauthorized', 'the token was refused');
  }
  if (!response.ok) {
    throw new ApiError(response.status, data?.error, data?.message);
  }
  return data;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

// ---------------------------------------------------------------------------------------
// Frame: login, navigation, flash messages, the router.

const view = document.getElementById('view');
const flashBox = document.getElementById('flash');

/** Bumped on every navigation: an answer for an older view is dropped, and timers of an
 *  older view stop themselves. */
let generation = 0;
let timers = [];

function showLogin(message) {
  generation += 1;
  stopTimers();
  document.getElementById('login').hidden = false;
  document.getElementById('nav').hidden = true;
  view.replaceChildren();
  const error = document.getElementById('login-error');
  error.hidden = !message;
  error.textContent = message || '';
  document.getElementById('token').focus();
}

function flash(message, isError = false) {
  flashBox.textContent = message;
  flashBox.className = isError ? 'flash error' : 'flash';
  flashBox.hidden = false;
}

function stopTimers() {
  for (const t of timers) clearTimeout(t);
  timers = [];
}

/** Runs `step` every `ms` while this view is current. */
function every(ms, mine, step) {
  const tick = async () => {
    if (mine !== generation) return;
    await step();
    if (mine === generation) timers.push(setTimeout(tick, ms));
  };
  timers.push(setTimeout(tick, ms));
}

function errorBox(err) {
  return el('p', { class: 'error-box', role: 'alert' }, String(err));
}

/** A percent-encoded part of the address, or the part itself when it is not valid. */
function decoded(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

function route() {
  generation += 1;
  stopTimers();
  flashBox.hidden = true;
  if (!token()) {
    showLogin();
    return;
  }
  document.getElementById('login').hidden = true;
  document.getElementById('nav').hidden = false;
  const hash = location.hash.replace(/^#/, '') || '/';
  const [pathPart, searchPart = ''] = hash.split('?');
  const parts = pathPart.split('/').filter(Boolean);
  const params = new URLSearchParams(searchPart);
  const mine = generation;
  let page;
  let section = parts[0] ?? '';
  if (section === '') page = overview(mine);
  else if (section === 'events') page = events(mine, params);
  else if (section === 'event' && parts.length === 3) {
    section = 'events';
    page = eventPage(mine, decoded(parts[1]), decoded(parts[2]));
  } else if (section === 'dead') page = dead(mine, params);
  else if (section === 'jobs' && parts.length === 2) {
    section = 'dead';
    page = jobPage(mine, decoded(parts[1]));
  } else page = Promise.resolve(el('p', { class: 'error-box' }, 'No such page.'));
  for (const link of document.querySelectorAll('#nav a')) {
    link.classList.toggle('current', link.id === `nav-${section || 'overview'}`);
  }
  view.replaceChildren(el('p', { class: 'empty' }, 'Loading…'));
  page.then(
    (node) => { if (mine === generation) view.replaceChildren(node); },
    (err) => { if (mine === generation && err.status !== 401) view.replaceChildren(errorBox(err)); },
  );
}

// ---------------------------------------------------------------------------------------
// Overview: providers, counts per status, queue depth, paused state, paths per minute.

async function overview(mine) {
  // A refresh that fails leaves the last counts on screen, marked stale under a banner
  // that says since when; the next refresh that succeeds takes both away.
  const stale = el('p', { id: 'stale', class: 'error-box', role: 'alert', hidden: true });
  const shown = el('div');
  const root = el('div', { id: 'overview' }, el('h1', {}, 'Overview'), stale, shown);
  let shownAt = null;
  const fill = async () => {
    const stats = await api('GET', '/stats');
    if (mine !== generation) return;
    const cards = stats.providers.map((p) => providerCard(p, fill));
    const age = Math.round(stats.counts_age_s ?? 0);
    shown.replaceChildren(
      el('p', { class: 'note', id: 'counts-age' },
        `Rows per status as counted ${age} s ago (the node counts at most every `
        + `${Math.round(stats.counts_max_age_s ?? 0)} s); queues and paths are live.`),
      cards.length ? el('div', { class: 'grid' }, cards) : el('p', { class: 'empty' }, 'No providers.'),
    );
    shownAt = new Date();
    stale.hidden = true;
  };
  const markStale = (err) => {
    if (mine !== generation || err.status === 401) return;
    stale.textContent = `The overview could not be refreshed (${err}): the counts and pause `
      + `states below are from ${localTime(shownAt)} and may be out of date. `
      + `Trying again every ${STATS_EVERY / 1000} s.`;
    stale.hidden = false;
    for (const node of shown.children) node.classList.add('stale');
  };
  await fill();
  every(STATS_EVERY, mine, () => fill().catch(markStale));
  return root;
}

function providerCard(p, refresh) {
  const counts = p.counts ?? {};
  const known = STATUSES.filter((s) => s in counts || s !== 'in_progress');
  const others = Object.keys(counts).filter((s) => !STATUSES.includes(s));
  const toggle = el('button', {
    type: 'button',
    class: p.paused || p.target_pause_s ? 'resume' : 'pause secondary',
    'data-provider': p.name,
    onclick: async (event) => {
      event.target.disabled = true;
      // A resume also ends the pause the target asked for (on this node).
      const action = p.paused || p.target_pause_s ? 'resume' : 'pause';
      try {
        const answer = await api('POST', `/providers/${encodeURIComponent(p.name)}/${action}`);
        flash(`${answer.provider} is ${answer.paused ? 'paused' : 'running again'}.`);
        await refresh();
      } catch (err) {
        flash(String(err), true);
        event.target.disabled = false;
      }
    },
  }, p.paused || p.target_pause_s ? 'Resume' : 'Pause');
  const queue = p.queue ?? { rows: 0, oldest_due_s: 0 };
  return el('section', { class: 'card provider', 'data-provider': p.name },
    el('div', { class: 'provider-head' },
      el('h2', {}, p.name),
      el('span', { class: 'badge' }, p.mode),
      p.paused ? el('span', { class: 'badge paused state' }, 'paused') : el('span', { class: 'badge state' }, 'running'),
      el('span', { class: 'actions' }, toggle)),
    p.target_pause_s
      ? el('p', { class: 'target-pause' },
        el('span', { class: 'badge paused' }, 'held'),
        ` The target asked for time: ${Math.ceil(p.target_pause_s)} s left on this node. `,
        'Resume ends it.')
      : null,
    el('table', { class: 'counts' },
      el('tr', {}, [...known, ...others].map((s) => el('th', { class: 'num' }, s))),
      el('tr', {}, [...known, ...others].map((s) => el('td', { class: 'num', 'data-status': s },
        el('a', { href: `#/events${query({ provider: p.name, status: s })}` }, counts[s] ?? 0))))),
    el('p', { class: 'queue-line' },
      'Queue: ', el('span', { class: 'queue-rows' }, queue.rows),
      queue.rows === 1 ? ' row due or waiting' : ' rows due or waiting',
      queue.rows ? `, oldest due ${Number(queue.oldest_due_s).toFixed(1)} s ago` : ''),
    pathsChart(p.paths_per_minute ?? []));
}

/** Stacked bars of attempts per minute, one colour per path, with a legend. */
function pathsChart(minutes) {
  const wrap = el('div', { class: 'chart-wrap' });
  if (!minutes.length) {
    wrap.append(el('p', { class: 'empty' }, 'No attempts in the chart’s window.'));
    return wrap;
  }
  const width = 360;
  const height = 120;
  const left = 28;
  const bottom = 16;
  // One slot a minute, from the first minute shown (at least CHART_MINUTES back) to now.
  const now = Math.floor(Date.now() / 60000) * 60;
  const known = minutes.map((m) => m.minute);
  const start = Math.max(now - 60 * (CHART_MAX - 1),
    Math.min(now - 60 * (CHART_MINUTES - 1), ...known));
  const rows = minutes.filter((m) => m.minute >= start && m.minute <= now);
  const slots = (now - start) / 60 + 1;
  const totals = rows.map((m) => Object.values(m.counts).reduce((a, b) => a + b, 0));
  const top = Math.max(1, ...totals);
  const slot = (width - left) / slots;
  const bar = Math.max(2, slot * 0.8);
  const chart = svg('svg', {
    class: 'chart', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
  });
  chart.append(svg('title', {}, 'Attempts per minute, by path'));
  chart.append(svg('line', { class: 'axis', x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
  chart.append(svg('text', { x: 0, y: 10 }, top));
  chart.append(svg('text', { x: 0, y: height - bottom }, 0));
  const seen = new Set();
  rows.forEach((m) => {
    let y = height - bottom;
    const x = left + ((m.minute - start) / 60) * slot + (slot - bar) / 2;
    for (const [path, n] of Object.entries(m.counts)) {
      if (!n) continue;
      seen.add(path);
      const h = ((height - bottom - 12) * n) / top;
      y -= h;
      chart.append(svg('rect', { class: pathClass(path), x, y, width: bar, height: h },
        svg('title', {}, `${localTime(new Date(m.minute * 1000)).slice(11, 16)} ${path}: ${n}`)));
    }
  });
  const first = localTime(new Date(start * 1000)).slice(11, 16);
  const last = localTime(new Date(now * 1000)).slice(11, 16);
  chart.append(svg('text', { x: left, y: height - 3 }, first));
  chart.append(svg('text', { x: width - 28, y: height - 3 }, last));
  wrap.append(chart, el('div', { class: 'legend' },
    [...seen].sort().map((path) => el('span', {},
      el('span', { class: `swatch ${pathClass(path)}` }), path))));
  return wrap;
}

// ---------------------------------------------------------------------------------------
// Events: filters and keyset paging.

/** Cursors of the pages before the current one, per filter (for "Previous"). */
const pageStacks = new Map();

async function providerNames() {
  const stats = await api('GET', '/stats');
  return stats.providers.map((p) => p.name);
}

function select(name, values, current, anyLabel = 'any') {
  return el('select', { name, id: `f-${name}` },
    el('option', { value: '' }, anyLabel),
    values.map((v) => el('option', { value: v, selected: v === current }, v)));
}

function input(name, current, type = 'text') {
  return el('input', { name, id: `f-${name}`, type, value: current ?? '' });
}

function field(label, control) {
  return el('label', {}, label, control);
}

/** The filter form; on submit it writes its values into the address of `base`. */
function filterForm(base, params, fields, providers) {
  const form = el('form', { class: 'filters card', id: 'filters' });
  const controls = {
    provider: () => select('provider', providers, params.get('provider')),
    status: () => select('status', STATUSES, params.get('status')),
    path: () => select('path', PATHS, params.get('path')),
    key_prefix: () => input('key_prefix', params.get('key_prefix')),
    mode: () => select('mode', ['sync', 'queue'], params.get('mode')),
    reason: () => input('reason', params.get('reason')),
    limit: () => select('limit', ['25', '50', '100', '250'], params.get('limit') ?? '', 'default'),
  };
  const labels = {
    provider: 'Provider', status: 'Status', path: 'Last path', key_prefix: 'Key prefix',
    mode: 'Mode', reason: 'Dead reason', limit: 'Per page',
    created_after: 'Created from', created_before: 'Created before',
    updated_after: 'Updated from', updated_before: 'Updated before',
  };
  for (const name of fields) {
    const control = TIME_FILTERS.includes(name)
      ? input(name, toLocalInput(params.get(name)), 'datetime-local')
      : controls[name]();
    form.append(field(labels[name], control));
  }
  form.append(el('span', { class: 'buttons' },
    el('button', { type: 'submit', id: 'apply' }, 'Apply'),
    el('button', {
      type: 'button',
      class: 'secondary',
      onclick: () => { location.hash = base; },
    }, 'Clear')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const values = {};
    for (const name of fields) {
      const raw = form.elements[name].value.trim();
      values[name] = TIME_FILTERS.includes(name) ? toUnix(raw) : raw;
    }
    location.hash = `${base}${query(values)}`;
  });
  return form;
}

/** A page of events for `params` (filters and `cursor`), with Previous/Next. */
async function eventTable(base, params, extra = {}) {
  const filter = {};
  for (const name of EVENT_FILTERS) filter[name] = params.get(name) ?? '';
  Object.assign(filter, extra);
  const cursor = params.get('cursor') ?? '';
  const page = await api('GET', `/events${query({ ...filter, cursor })}`);
  const stackKey = `${base}${query(filter)}`;
  const stack = pageStacks.get(stackKey) ?? [];
  // A page reached other than through "Next" starts a fresh history of pages.
  if (!cursor) pageStacks.set(stackKey, []);
  const rows = page.events.map((e) => el('tr', { class: 'event-row', 'data-key': e.event_key },
    el('td', {}, e.provider),
    el('td', { class: 'mono' }, el('a', { href: eventHref(e.provider, e.event_key) }, e.event_key)),
    el('td', {}, badge('status', e.status)),
    el('td', {}, e.mode ?? ''),
    el('td', { class: 'num' }, e.attempts),
    el('td', {}, e.last_path ?? '—'),
    el('td', {}, when(e.updated_at)),
    el('td', { class: 'clip' }, e.dead_reason ?? e.last_error ?? '')));
  const goto = (next) => {
    location.hash = `${base}${query({ ...Object.fromEntries(params), cursor: next })}`;
  };
  const pager = el('div', { class: 'pager' },
    el('button', {
      type: 'button',
      class: 'secondary',
      id: 'prev-page',
      disabled: !cursor,
      onclick: () => {
        const previous = pageStacks.get(stackKey) ?? [];
        goto(previous.pop() ?? '');
      },
    }, 'Previous'),
    el('button', {
      type: 'button',
      class: 'secondary',
      id: 'next-page',
      disabled: !page.next_cursor,
      onclick: () => {
        stack.push(cursor);
        pageStacks.set(stackKey, stack);
        goto(page.next_cursor);
      },
    }, 'Next'),
    el('span', {}, `${page.events.length} shown`),
    page.truncated ? el('span', { class: 'error' }, 'this page was cut short by its size') : '',
    page.scan_stopped ? el('span', { class: 'note', id: 'scan-stopped' },
      'the search stopped after reading its share of rows; Next searches further back') : '');
  return el('div', { class: 'card' },
    el('table', { id: 'events-table' },
      el('thead', {}, el('tr', {},
        ['Provider', 'Key', 'Status', 'Mode', 'Attempts', 'Last path', 'Updated', 'Reason / error']
          .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows.length ? rows
        : el('tr', {}, el('td', { colspan: 8, class: 'empty' }, 'No events match.')))),
    pager);
}

async function events(mine, params) {
  const providers = await providerNames();
  const table = await eventTable('#/events', params);
  return el('div', { id: 'events' },
    el('h1', {}, 'Events'),
    filterForm('#/events', params, EVENT_FILTERS, providers),
    table);
}

// ---------------------------------------------------------------------------------------
// One event: its row, its attempts, its payload and headers, and a replay.

async function eventPage(mine, provider, key) {
  const event = await api('GET', eventApiPath(provider, key));
  return renderEvent(mine, event);
}

function renderEvent(mine, event) {
  // The detail answer's `attempts` is a page of the history (a list) and `attempt_count`
  // the row's count; a listed row's `attempts` is its count.
  const count = event.attempt_count ?? (Array.isArray(event.attempts) ? null : event.attempts);
  const fields = [
    ['Provider', event.provider], ['Route', event.route], ['Key', event.event_key],
    ['Status', badge('status', event.status)],
    ['Mode', event.mode], ['Attempts', count], ['Last path', event.last_path],
    ['Target answered', event.result_status], ['Dead reason', event.dead_reason],
    ['Last error', event.last_error], ['Lease left', event.lease_left_s ? `${event.lease_left_s} s` : null],
    ['Fingerprint', event.fingerprint], ['Content type', event.content_type],
    ['Created', when(event.created_at)], ['Updated', when(event.updated_at)],
  ];
  const result = el('p', { id: 'replay-result', hidden: true });
  const replay = el('button', {
    type: 'button',
    id: 'replay',
    class: 'danger',
    disabled: event.status !== 'dead',
    title: event.status === 'dead' ? 'Deliver it once more' : 'Only a dead letter can be replayed',
    onclick: async () => {
      replay.disabled = true;
      try {
        const after = await api('POST', eventApiPath(event.provider, event.event_key, '/replay'));
        if (mine !== generation) return;
        flash(`Replayed: the event is now ${after.status}.`, after.status !== 'done');
        const fresh = await api('GET', eventApiPath(event.provider, event.event_key));
        if (mine === generation) view.replaceChildren(renderEvent(mine, fresh));
      } catch (err) {
        result.hidden = false;
        result.className = 'error-box';
        result.textContent = err.code === 'not_dead'
          ? 'Not replayed: the event is not a dead letter.' : `Not replayed: ${err}`;
        replay.disabled = false;
      }
    },
  }, 'Replay');
  return el('div', { id: 'event' },
    el('h1', {}, 'Event ', el('span', { class: 'mono' }, event.event_key)),
    el('div', { class: 'two' },
      el('section', { class: 'card', id: 'event-row' },
        el('dl', { class: 'fields' }, fields.filter(([, v]) => v !== null && v !== undefined && v !== '')
          .map(([name, value]) => [el('dt', {}, name), el('dd', {}, value)])),
        el('div', { class: 'plan' }, replay,
          event.status === 'dead' ? '' : el('span', { class: 'note' }, 'Only a dead letter can be replayed.'),
          result)),
      el('div', {},
        el('section', { class: 'card' }, el('h2', {}, 'Payload'), payloadBox(event)),
        el('section', { class: 'card' }, el('h2', {}, 'Kept request headers'), headerTable(event.request_headers)))),
    routesSection(event),
    attemptsSection(event));
}

/** The event on each route of its provider: a route's own row (status, attempts, last path;
 *  open it for its history), or none when the route did not take the event. Shown only for
 *  a provider with more than one route. */
function routesSection(event) {
  const routes = Array.isArray(event.routes) ? event.routes : [];
  if (routes.length < 2) return '';
  return el('section', { class: 'card', id: 'routes' },
    el('h2', {}, 'Routes'),
    el('table', {},
      el('thead', {}, el('tr', {}, ['Route', 'Status', 'Attempts', 'Last path'].map((h) => el('th', {}, h)))),
      el('tbody', {}, routes.map((r) => el('tr', { 'data-route': r.route },
        el('td', {}, r.provider === event.provider ? r.route
          : el('a', { href: eventHref(r.provider, event.event_key) }, r.route)),
        el('td', {}, r.status ? badge('status', r.status) : el('span', { class: 'note' }, 'not taken')),
        el('td', {}, r.attempts ?? ''),
        el('td', {}, r.last_path ?? ''))))));
}

/** The event's latest page of attempts, how many there are in all, and a button that puts
 *  the page before it (older attempts) in front, one page a click. */
function attemptsSection(event) {
  const section = el('section', { class: 'card', id: 'attempts' });
  let shown = Array.isArray(event.attempts) ? event.attempts : [];
  let before = event.attempts_before ?? null;
  const total = event.attempts_total ?? shown.length;
  const older = async (click) => {
    click.target.disabled = true;
    try {
      const page = await api('GET', eventApiPath(event.provider, event.event_key, '', { before }));
      shown = [...(page.attempts ?? []), ...shown];
      before = page.attempts_before ?? null;
      draw();
    } catch (err) {
      flash(String(err), true);
      click.target.disabled = false;
    }
  };
  const draw = () => {
    section.replaceChildren(
      el('h2', {}, 'Attempts'),
      total ? el('p', { class: 'note', id: 'attempts-shown' },
        shown.length < total ? `The latest ${shown.length} of ${total}.` : `${total} in all.`) : '',
      before != null
        ? el('button', { type: 'button', class: 'secondary', id: 'older-attempts', onclick: older },
          'Older attempts')
        : '',
      timeline(shown));
  };
  draw();
  return section;
}

function timeline(attempts) {
  if (!Array.isArray(attempts) || !attempts.length) {
    return el('p', { class: 'empty', id: 'timeline-empty' },
      'No attempt history: a plain first run that was done at once keeps only its row.');
  }
  return el('ol', { class: 'timeline', id: 'timeline' }, attempts.map((a) => el('li', {
    class: `attempt outcome-${classWord(a.outcome)}`,
    'data-attempt': a.attempt,
    'data-outcome': a.outcome,
  },
  el('h3', {}, `Attempt ${a.attempt} · ${a.path} · `, badge('outcome', a.outcome),
    a.target_status != null ? ` · target ${a.target_status}` : ''),
  el('div', { class: 'when' },
    `${when(a.started_at)} → ${when(a.ended_at)}`,
    a.duration_ms != null ? ` (${a.duration_ms} ms)` : '',
    ` · node ${a.node ?? '—'} · ${a.mode ?? ''}`),
  a.error ? el('div', { class: 'error attempt-error' }, a.error) : '',
  a.answer ? el('pre', { class: 'box attempt-answer' }, a.answer) : '')));
}

function payloadBox(event) {
  const p = event.payload;
  let text;
  if (p === null || p === undefined) text = 'Not kept.';
  else if (typeof p === 'string') text = p;
  else text = `Not text: ${p.bytes} bytes.`;
  return el('pre', { class: 'box', id: 'payload' }, text);
}

function headerTable(headers) {
  if (!headers || !Object.keys(headers).length) return el('p', { class: 'empty' }, 'None kept.');
  return el('table', { id: 'headers' }, Object.entries(headers).map(([name, value]) => el('tr', {},
    el('th', { class: 'mono' }, name),
    el('td', { class: 'mono' }, typeof value === 'string' ? value : JSON.stringify(value)))));
}

// ---------------------------------------------------------------------------------------
// Dead letters and bulk replay: plan (a count), confirm, then the job's progress.

const DEAD_FILTERS = ['provider', 'reason', 'updated_after', 'updated_before', 'limit'];

async function dead(mine, params) {
  const providers = await providerNames();
  const table = await eventTable('#/dead', params, { status: 'dead' });
  const jobs = await api('GET', '/replays');
  const filter = { status: 'dead' };
  for (const name of ['provider', 'reason', 'updated_after', 'updated_before']) {
    const value = params.get(name);
    if (value) filter[name] = TIME_FILTERS.includes(name) ? Number(value) : value;
  }
  return el('div', { id: 'dead' },
    el('h1', {}, 'Dead letters'),
    filterForm('#/dead', params, DEAD_FILTERS, providers),
    bulkReplay(mine, filter),
    table,
    jobList(jobs.jobs ?? []));
}

function bulkReplay(mine, filter) {
  const box = el('section', { class: 'card', id: 'bulk' });
  const start = () => {
    box.replaceChildren(
      el('h2', {}, 'Replay in bulk'),
      el('p', {}, 'Replays every dead letter this filter matches, at a bounded rate, on one node.'),
      el('button', { type: 'button', id: 'plan', onclick: plan }, 'Plan a replay of all matching…'));
  };
  const plan = async () => {
    let count;
    try {
      ({ count } = await api('POST', '/replays/plan', { filter }));
    } catch (err) {
      box.append(errorBox(err));
      return;
    }
    if (mine !== generation) return;
    const rate = el('input', { id: 'rate', type: 'number', min: 1, max: 1000, value: 10 });
    box.replaceChildren(
      el('h2', {}, 'Replay in bulk'),
      el('p', { id: 'plan-count' },
        `${count} ${count === 1 ? 'dead letter matches' : 'dead letters match'} this filter.`),
      el('div', { class: 'plan' },
        field('Replays a second', rate),
        el('button', {
          type: 'button',
          id: 'plan-confirm',
          class: 'danger',
          disabled: count === 0,
          onclick: async (event) => {
            event.target.disabled = true;
            try {
              const job = await api('POST', '/replays', { filter, rate: Number(rate.value) || 10 });
              location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
            } catch (err) {
              box.append(errorBox(err));
              event.target.disabled = false;
            }
          },
        }, `Replay ${count}`),
        el('button', { type: 'button', id: 'plan-back', class: 'secondary', onclick: start }, 'Back')));
  };
  start();
  return box;
}

function jobList(jobs) {
  return el('section', { class: 'card', id: 'jobs' },
    el('h2', {}, 'Replay jobs'),
    jobs.length ? el('table', {},
      el('tr', {}, ['Job', 'Status', 'Progress', 'Rate', 'Created', 'Filter'].map((h) => el('th', {}, h))),
      jobs.map((j) => el('tr', {},
        el('td', {}, el('a', { href: `#/jobs/${encodeURIComponent(j.id)}` }, `#${j.id}`)),
        el('td', {}, badge('job', j.status)),
        el('td', { class: 'num' }, `${j.replayed + j.failed} / ${j.total}`),
        el('td', { class: 'num' }, `${j.rate}/s`),
        el('td', {}, whenUnix(j.created_at)),
        el('td', { class: 'mono clip' }, filterText(j.filter)))))
      : el('p', { class: 'empty' }, 'No jobs yet.'));
}

/** A job's filter (JSON text) as `name=value` pairs, without the empty ones; a job to a
 *  route (`{filter, to_route}`) says which route its events go to. */
function filterText(text) {
  let filter;
  try {
    filter = JSON.parse(text);
  } catch {
    return text;
  }
  if (!filter || typeof filter !== 'object') return text;
  if (typeof filter.to_route === 'string' && filter.filter && typeof filter.filter === 'object') {
    return `to route ${filter.to_route}: ${filterText(JSON.stringify(filter.filter))}`;
  }
  return Object.entries(filter)
    .filter(([, v]) => v !== null && v !== '')
    .map(([k, v]) => `${k}=${TIME_FILTERS.includes(k) ? whenUnix(v) : v}`)
    .join(' ') || 'everything';
}

async function jobPage(mine, id) {
  const root = el('div', { id: 'job' });
  const fill = async () => {
    const job = await api('GET', `/replays/${encodeURIComponent(id)}`);
    if (mine !== generation) return false;
    const done = job.replayed + job.failed;
    const cancel = el('button', {
      type: 'button',
      id: 'job-cancel',
      class: 'danger',
      hidden: job.status !== 'running',
      onclick: async (event) => {
        event.target.disabled = true;
        try {
          await api('POST', `/replays/${encodeURIComponent(id)}/cancel`);
          await fill();
        } catch (err) {
          flash(String(err), true);
          event.target.disabled = false;
        }
      },
    }, 'Cancel');
    const items = job.items ?? [];
    root.replaceChildren(
      el('h1', {}, `Replay job #${job.id}`),
      el('section', { class: 'card' },
        el('div', { class: 'plan' },
          el('progress', { id: 'job-progress', max: Math.max(job.total, 1), value: done }),
          el('span', { id: 'job-counts' },
            `${job.replayed} replayed, ${job.failed} failed, of ${job.total}`),
          el('span', { id: 'job-state', class: `badge job-${classWord(job.status)}` }, job.status),
          job.waiting ? el('span', { id: 'job-waiting', class: 'badge paused' }, job.waiting) : null,
          cancel),
        el('dl', { class: 'fields' },
          el('dt', {}, 'Filter'), el('dd', { class: 'mono' }, filterText(job.filter)),
          el('dt', {}, 'Rate'), el('dd', {}, `${job.rate} a second`),
          el('dt', {}, 'Node'), el('dd', {}, job.owner ?? '—'),
          el('dt', {}, 'Created'), el('dd', {}, whenUnix(job.created_at)),
          el('dt', {}, 'Updated'), el('dd', {}, whenUnix(job.updated_at)))),
      el('section', { class: 'card' },
        el('h2', {}, 'Events'),
        items.length ? el('table', { id: 'job-items' },
          el('tr', {}, ['Provider', 'Key', 'Outcome', 'Detail', 'At'].map((h) => el('th', {}, h))),
          items.map((item) => el('tr', {},
            el('td', {}, item.provider),
            el('td', { class: 'mono' }, el('a', { href: eventHref(item.provider, item.key) }, item.key)),
            el('td', {}, badge('outcome', item.outcome)),
            el('td', {}, item.detail ?? ''),
            el('td', {}, whenUnix(item.at)))))
          : el('p', { class: 'empty' }, 'Nothing replayed yet.')));
    return job.status === 'running';
  };
  const running = await fill();
  if (running) {
    const poll = async () => {
      if (mine !== generation) return;
      let again = true;
      try {
        again = await fill();
      } catch {
        again = true;
      }
      if (again && mine === generation) timers.push(setTimeout(poll, JOB_EVERY));
    };
    timers.push(setTimeout(poll, JOB_EVERY));
  }
  return root;
}

// ---------------------------------------------------------------------------------------
// Start.

/** Checks the typed token with one call and keeps it only once the node took it: a token
 *  refused, or one the node could not check, is not kept. */
async function login() {
  const field = document.getElementById('token');
  const typed = field.value;
  field.value = '';
  sessionStorage.removeItem(TOKEN_KEY);
  if (!typed) {
    showLogin('Type the token first.');
    return;
  }
  try {
    await call('GET', '/stats', undefined, typed);
  } catch (err) {
    showLogin(loginFailure(err));
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, typed);
  route();
}

/** Why a typed token was not kept: refused (a wrong token), or not checked (the node). */
function loginFailure(err) {
  if (err.status === 401) return 'The token was refused.';
  const why = err.status === 0 ? err.message : `the node answered ${err}`;
  return `The token could not be checked (${why}); it was not kept. Try again once the node answers.`;
}

document.getElementById('login-button').addEventListener('click', login);
document.getElementById('token').addEventListener('keydown', (event) => {
  if (event.key === 'Enter') login();
});

document.getElementById('logout').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
});

window.addEventListener('hashchange', route);
route();
