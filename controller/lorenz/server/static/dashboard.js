// Lorenz dashboard: renders runtime snapshots from /api/v1/events (server-sent events), falling
// back to polling /api/v1/state while the stream is down. Plain DOM, no framework, no build.
//
// NB: everything that comes from a tracker or an agent (titles, messages, errors, identifiers)
// is tracker- or model-controlled text. It is only ever set through textContent / setAttribute,
// never innerHTML, and links are kept to http(s) URLs. The server's CSP is the second wall.
(function () {
  'use strict';

  var STATE_URL = '/api/v1/state';
  var EVENTS_URL = '/api/v1/events';
  var REFRESH_URL = '/api/v1/refresh';
  var TOKEN_KEY = 'lorenz-token';
  var POLL_FALLBACK_MS = 2000;
  var SSE_RETRY_MS = 5000;
  var TICK_MS = 500;
  // NB: a lane shows at most this many cards (the count says how many there are): at a
  // thousand runs, rebuilding and re-laying-out every card on each snapshot would pin a core.
  var MAX_CARDS = 120;

  var BAD_EVENTS = {
    poll_error: 1, run_failed: 1, run_stalled: 1, reconcile_refresh_failed: 1,
    workflow_reload_failed: 1, startup_workspace_cleanup_failed: 1, leadership_lost: 1,
    reservation_expired: 1
  };
  var GOOD_EVENTS = {
    run_finished: 1, workflow_reloaded: 1
  };
  var QUIET_EVENTS = { poll_completed: 1, dry_run: 1, refresh_requested: 1 };

  var current = null;          // the newest snapshot applied
  var spendBySlot = {};        // slot key -> its run's spend (while a budget cap is set)
  var spendByIssue = {};       // issue id -> its spend over all runs
  var currentAt = 0;           // its generated_at, ms since epoch (server clock)
  var clockOffsetMs = 0;       // server wall clock minus this browser's
  var snapshotCount = 0;
  var renderScheduled = false;
  var source = null;
  var pollTimer = null;

  // ------------------------------------------------------------------ helpers

  function $(testid) {
    return document.querySelector('[data-testid="' + testid + '"]');
  }

  // Builds an element. props: class, testid, title, href, data (object), text.
  function el(tag, props, children) {
    var node = document.createElement(tag);
    props = props || {};
    if (props.class) node.className = props.class;
    if (props.testid) node.setAttribute('data-testid', props.testid);
    if (props.title) node.setAttribute('title', String(props.title));
    if (props.href) node.setAttribute('href', props.href);
    if (props.data) {
      Object.keys(props.data).forEach(function (key) {
        var value = props.data[key];
        if (value !== null && value !== undefined) node.setAttribute('data-' + key, String(value));
      });
    }
    if (props.text !== undefined && props.text !== null) node.textContent = String(props.text);
    (children || []).forEach(function (child) {
      if (child === null || child === undefined || child === false) return;
      node.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
    });
    return node;
  }

  function setText(testid, text) {
    var node = $(testid);
    if (node) node.textContent = text;
  }

  // ISO-8601 with microseconds and an offset -> ms since epoch (or NaN).
  function parseIso(value) {
    if (!value) return NaN;
    var trimmed = String(value).replace(/(\.\d{3})\d+/, '$1');
    return Date.parse(trimmed);
  }

  function serverNow() {
    return Date.now() + clockOffsetMs;
  }

  function formatInt(value) {
    var number = Number(value) || 0;
    return number.toLocaleString('en-US');
  }

  function formatDuration(ms) {
    if (!isFinite(ms)) return '—';
    var total = Math.max(0, Math.floor(ms / 1000));
    var hours = Math.floor(total / 3600);
    var minutes = Math.floor((total % 3600) / 60);
    var seconds = total % 60;
    if (hours > 0) return hours + 'h ' + pad(minutes) + 'm';
    if (minutes > 0) return minutes + 'm ' + pad(seconds) + 's';
    return seconds + 's';
  }

  function formatCountdown(ms) {
    if (!isFinite(ms)) return '—';
    if (ms <= 500) return 'due now';
    return 'in ' + formatDuration(ms + 999);
  }

  function pad(number) {
    return number < 10 ? '0' + number : String(number);
  }

  function formatClock(iso) {
    var at = parseIso(iso);
    if (!isFinite(at)) return '—';
    var date = new Date(at - clockOffsetMs);
    return pad(date.getHours()) + ':' + pad(date.getMinutes()) + ':' + pad(date.getSeconds());
  }

  function formatAgo(iso) {
    var at = parseIso(iso);
    if (!isFinite(at)) return '';
    return formatDuration(serverNow() - at) + ' ago';
  }

  function safeUrl(url) {
    return typeof url === 'string' && /^https?:\/\//i.test(url) ? url : null;
  }

  // An element whose text the ticker keeps current: elapsed since, or countdown until, `iso`.
  function ticking(kind, iso, props) {
    props = props || {};
    props.data = Object.assign({}, props.data || {});
    props.data[kind] = iso;
    var node = el('span', props);
    updateTicking(node);
    return node;
  }

  function updateTicking(node) {
    var since = node.getAttribute('data-since');
    var until = node.getAttribute('data-until');
    var ago = node.getAttribute('data-ago');
    var text;
    if (since) text = formatDuration(serverNow() - parseIso(since));
    else if (until) text = formatCountdown(parseIso(until) - serverNow());
    else if (ago) text = formatAgo(ago);
    else return;
    // Only real changes touch the DOM (and so only they cost a layout).
    if (node.textContent !== text) node.textContent = text;
  }

  function tick() {
    var nodes = document.querySelectorAll('[data-since], [data-until], [data-ago]');
    for (var i = 0; i < nodes.length; i++) updateTicking(nodes[i]);
    renderRuntimeTotal();
  }

  // ------------------------------------------------------------------ rendering

  function render() {
    renderScheduled = false;
    var s = current;
    if (!s) return;
    renderHeader(s);
    renderConfigError(s.config_error);
    renderTotals(s);
    spendBySlot = {};
    spendByIssue = {};
    if (s.budget) {
      (s.budget.runs || []).forEach(function (r) { spendBySlot[r.slot_key] = r; });
      (s.budget.issues || []).forEach(function (r) { spendByIssue[r.issue_id] = r; });
    }
    renderLane('running', s.running || [], runningCard, 'no runs in flight');
    renderLane('reserving', s.reserving || [], reservingCard, 'none');
    renderLane('retrying', s.retrying || [], retryCard, 'none');
    renderLane('blocked', s.blocked || [], blockedCard, 'none');
    renderWaiting(s.waiting || []);
    renderBudget(s.budget);
    renderHistory(s.run_history || []);
    renderEvents(s.recent_events || []);
    renderFooter(s);
    var running = (s.running || []).length;
    var retrying = (s.retrying || []).length;
    document.title = 'Lorenz · ' + running + ' running · ' + retrying + ' retrying';
    document.body.setAttribute('data-snapshots', String(snapshotCount));
  }

  function renderHeader(s) {
    var status = $('app-status');
    status.textContent = s.app_status || 'unknown';
    status.setAttribute('data-status', s.app_status || 'unknown');
    setText('workflow-path', s.workflow_path || '—');
    $('workflow-path').setAttribute('title', s.workflow_path || '');

    var poll = s.poll || {};
    var next = $('next-poll');
    next.removeAttribute('data-until');
    if (poll.status === 'polling') {
      next.textContent = 'polling…';
    } else if (s.app_status !== 'running' || !poll.next_poll_at) {
      next.textContent = '—';
    } else {
      next.setAttribute('data-until', poll.next_poll_at);
      updateTicking(next);
    }
    var last = $('last-poll');
    last.removeAttribute('data-ago');
    if (poll.last_poll_at) {
      last.setAttribute('data-ago', poll.last_poll_at);
      last.setAttribute('title', poll.last_poll_at);
      updateTicking(last);
    } else {
      last.textContent = 'never';
    }
    setText('poll-counts', formatInt(poll.candidates) + ' / ' + formatInt(poll.eligible));

    var banner = $('poll-error');
    var paused = poll.dispatch_paused;
    if (paused) {
      // A fault of the host (claim store, worker launch or placement): nothing new starts.
      banner.hidden = false;
      banner.textContent = '';
      banner.setAttribute('data-code', paused.code);
      banner.appendChild(el('strong', { text: 'Dispatch paused (' + paused.code + '): ' }));
      banner.appendChild(document.createTextNode(paused.message));
    } else if (poll.last_error) {
      banner.hidden = false;
      banner.textContent = '';
      banner.removeAttribute('data-code');
      banner.appendChild(el('strong', { text: 'Last poll failed: ' }));
      banner.appendChild(document.createTextNode(poll.last_error));
    } else {
      banner.removeAttribute('data-code');
      banner.hidden = true;
      banner.textContent = '';
    }
  }

  // The reload error in force: the runtime keeps the last good WORKFLOW.md until a reload
  // succeeds, and the banner stays as long as the snapshot carries the error.
  function renderConfigError(error) {
    var banner = $('config-error');
    banner.textContent = '';
    if (!error) {
      banner.hidden = true;
      banner.removeAttribute('data-code');
      return;
    }
    banner.hidden = false;
    banner.setAttribute('data-code', String(error.code || ''));
    banner.appendChild(el('strong', { text: 'WORKFLOW.md reload failed: ' }));
    banner.appendChild(el('span', { testid: 'config-error-code', class: 'code', text: error.code }));
    banner.appendChild(document.createTextNode(' '));
    banner.appendChild(el('span', { testid: 'config-error-message', text: error.message }));
    banner.appendChild(el('span', {
      testid: 'config-error-since', class: 'since',
      title: error.since, text: ' — since ' + String(error.since || '?') +
        '; still running the last good workflow'
    }));
  }

  // Spend control, while a budget cap is set: the day's spend against its cap, and the
  // issues held back at a cap (the budget lane).
  function renderBudget(budget) {
    var total = $('budget-total');
    var lane = $('lane-budget');
    if (!budget) {
      total.hidden = true;
      lane.hidden = true;
      return;
    }
    total.hidden = false;
    lane.hidden = false;
    var day = budget.day_spend || {};
    var text = formatUsd(day.usd);
    if (Number(budget.max_usd_per_day) > 0) {
      text += ' / ' + formatUsd(budget.max_usd_per_day);
    }
    setText('budget-day', text);
    $('budget-day').setAttribute('title', budget.day + ': ' + formatInt(day.tokens) + ' tokens');
    renderLane('budget', budget.held || [], budgetCard, 'none');
  }

  function formatUsd(value) {
    var n = Number(value) || 0;
    return '$' + n.toFixed(n > 0 && n < 0.1 ? 4 : 2);
  }

  function budgetCard(row) {
    var tokens = String(row.cap || '').indexOf('tokens') === 0;
    var figures = tokens
      ? formatInt(row.spent) + ' / ' + formatInt(row.limit) + ' tokens'
      : formatUsd(row.spent) + ' / ' + formatUsd(row.limit);
    return el('article', {
      class: 'card budget', testid: 'budget-card', data: { 'issue-id': row.issue_id }
    }, [
      el('div', { class: 'card-head' }, [
        el('span', { class: 'identifier', testid: 'card-identifier', text: row.issue_identifier })
      ]),
      el('div', { class: 'fields' }, [
        field('cap', row.cap, { testid: 'card-cap' }),
        field('spent', figures, { testid: 'card-spent' }),
        field('held', ticking('since', row.held_at, { testid: 'card-held' }))
      ])
    ]);
  }

  function renderTotals(s) {
    var usage = s.usage_totals || {};
    setText('count-running', formatInt((s.running || []).length));
    setText('count-retrying', formatInt((s.retrying || []).length));
    setText('usage-input', formatInt(usage.input_tokens));
    setText('usage-output', formatInt(usage.output_tokens));
    setText('usage-total', formatInt(usage.total_tokens));
    setText('usage-cost', '$' + (Number(usage.cost_usd) || 0).toFixed(2));
    renderRuntimeTotal();
    setText('rate-limits', describeRateLimits(s.rate_limits));
  }

  // Agent time keeps growing between snapshots while runs are in flight.
  function renderRuntimeTotal() {
    if (!current) return;
    var usage = current.usage_totals || {};
    var running = (current.running || []).length;
    var sinceSnapshot = Math.max(0, serverNow() - currentAt);
    var ms = (Number(usage.seconds_running) || 0) * 1000 + running * sinceSnapshot;
    setText('usage-runtime', formatDuration(ms));
  }

  function describeRateLimits(limits) {
    if (!limits || typeof limits !== 'object') return '—';
    var parts = [];
    Object.keys(limits).forEach(function (key) {
      var value = limits[key];
      if (value === null || value === undefined) return;
      if (typeof value === 'object') {
        var inner = value.used_percent !== undefined ? value.used_percent + '%'
          : value.remaining !== undefined ? String(value.remaining) : '…';
        parts.push(key + ' ' + inner);
      } else {
        parts.push(key + ' ' + value);
      }
    });
    return parts.length ? parts.join(' · ') : '—';
  }

  function renderLane(name, rows, build, emptyText) {
    var lane = $('lane-' + name);
    var cards = lane.querySelector('.cards');
    setText('lane-count-' + name, String(rows.length));
    lane.setAttribute('data-count', String(rows.length));
    var fragment = document.createDocumentFragment();
    if (!rows.length) fragment.appendChild(el('p', { class: 'empty', text: emptyText }));
    rows.slice(0, MAX_CARDS).forEach(function (row) { fragment.appendChild(build(row)); });
    if (rows.length > MAX_CARDS) {
      fragment.appendChild(el('p', {
        class: 'more', testid: 'lane-more-' + name,
        text: '… and ' + formatInt(rows.length - MAX_CARDS) + ' more (see /api/v1/state)'
      }));
    }
    cards.replaceChildren(fragment);
  }

  function identifierNode(row) {
    var url = safeUrl(row.url);
    var props = { class: 'identifier', testid: 'card-identifier', text: row.identifier };
    if (url) {
      props.href = url;
      var link = el('a', props);
      link.setAttribute('target', '_blank');
      link.setAttribute('rel', 'noopener noreferrer');
      return link;
    }
    return el('span', props);
  }

  function badge(text, props) {
    props = props || {};
    props.class = 'badge' + (props.class ? ' ' + props.class : '');
    props.text = text;
    return el('span', props);
  }

  function cardHead(row, extra) {
    return el('div', { class: 'card-head' }, [
      identifierNode(row),
      badge('slot ' + row.slot_index, { testid: 'card-slot' }),
      row.attempt !== null && row.attempt !== undefined
        ? badge('attempt ' + row.attempt, { testid: 'card-attempt' })
        : badge('first run', { testid: 'card-attempt', class: 'muted' })
    ].concat(extra || []));
  }

  function titleNode(row) {
    return el('div', {
      class: 'title', testid: 'card-title', text: row.title || '', title: row.title || ''
    });
  }

  function field(label, value, props) {
    return el('div', { class: 'field' }, [
      el('span', { class: 'label', text: label }),
      value instanceof Node ? value : el('span', Object.assign({ text: value }, props || {}))
    ]);
  }

  function runningCard(row) {
    var usage = row.usage || {};
    var lastEvent = row.last_agent_event
      ? el('div', { class: 'last-event', testid: 'card-last-event',
        title: row.last_agent_message || row.last_agent_event }, [
        el('span', { class: 'event-name', text: row.last_agent_event }),
        row.last_agent_message ? el('span', { class: 'event-message', text: row.last_agent_message }) : null,
        row.last_agent_at ? ticking('ago', row.last_agent_at, { class: 'event-ago' }) : null
      ])
      : el('div', { class: 'last-event muted', testid: 'card-last-event', text: 'waiting for the agent…' });
    return el('article', {
      class: 'card running', testid: 'run-card', data: { 'slot-key': row.slot_key }
    }, [
      cardHead(row),
      titleNode(row),
      el('div', { class: 'fields' }, [
        field('elapsed', ticking('since', row.started_at, { testid: 'card-elapsed', class: 'strong' })),
        field('agent', row.agent_kind || '—', { testid: 'card-agent' }),
        field('host', row.host || 'local', { testid: 'card-host' }),
        field('turns', formatInt(row.turn_count), { testid: 'card-turns' }),
        field('tokens', formatInt(usage.input_tokens) + ' in · ' + formatInt(usage.output_tokens) + ' out',
          { testid: 'card-tokens' }),
        spendField(row)
      ]),
      lastEvent
    ]);
  }

  // "$0.25 run · $0.90 issue" while a budget cap is set; nothing otherwise.
  function spendField(row) {
    var run = spendBySlot[row.slot_key];
    if (!run) return null;
    var issue = spendByIssue[row.issue_id];
    var text = formatUsd(run.usd) + ' run';
    if (issue) text += ' · ' + formatUsd(issue.usd) + ' issue';
    return field('spend', text, { testid: 'card-spend' });
  }

  function reservingCard(row) {
    return el('article', {
      class: 'card reserving', testid: 'reserving-card', data: { 'slot-key': row.slot_key }
    }, [
      cardHead(row),
      titleNode(row),
      el('div', { class: 'fields' }, [
        field('waiting', ticking('since', row.reserved_at, { testid: 'card-elapsed' })),
        field('expires', ticking('until', row.expires_at, { testid: 'card-expires' }))
      ])
    ]);
  }

  function retryCard(row) {
    return el('article', {
      class: 'card retrying kind-' + row.kind, testid: 'retry-card', data: { 'slot-key': row.slot_key, kind: row.kind }
    }, [
      el('div', { class: 'card-head' }, [
        identifierNode(row),
        badge('slot ' + row.slot_index, { testid: 'card-slot' }),
        badge(row.kind, { testid: 'retry-kind', class: 'kind kind-' + row.kind }),
        badge('attempt ' + row.attempt, { testid: 'retry-attempt' })
      ]),
      el('div', { class: 'fields' }, [
        field('due', ticking('until', row.due_at, { testid: 'retry-due', class: 'strong' })),
        row.host ? field('host', row.host) : null
      ]),
      row.error ? errorNode(row.error, 'retry-error') : null
    ]);
  }

  function errorNode(text, testid) {
    return el('div', { class: 'error', testid: testid, title: text }, [el('span', { text: text })]);
  }

  function blockedCard(row) {
    return el('article', {
      class: 'card blocked', testid: 'blocked-card', data: { 'slot-key': row.slot_key }
    }, [
      el('div', { class: 'card-head' }, [identifierNode(row)]),
      el('div', { class: 'fields' }, [field('blocked', ticking('since', row.blocked_at))]),
      row.error ? errorNode(row.error, 'blocked-error') : null
    ]);
  }

  // The waiting lane: each card has an answer box. NB: rebuilt only when its rows change, so
  // that a snapshot arriving while someone types neither wipes the text nor steals the focus.
  var waitingShown = null;
  var answerDrafts = {};

  function renderWaiting(rows) {
    var signature = JSON.stringify(rows);
    if (signature === waitingShown) return;
    waitingShown = signature;
    renderLane('waiting', rows, waitingCard, 'none');
  }

  function waitingCard(row) {
    var box = el('textarea', { testid: 'answer-text' });
    box.setAttribute('aria-label', 'answer to ' + row.identifier);
    box.value = answerDrafts[row.slot_key] || '';
    box.addEventListener('input', function () { answerDrafts[row.slot_key] = box.value; });
    var notice = el('p', { class: 'answer-notice', testid: 'answer-notice' });
    notice.hidden = true;
    var button = el('button', { testid: 'answer-button', text: 'Answer' });
    button.setAttribute('type', 'button');
    button.addEventListener('click', function () {
      sendAnswer(row, box.value, button, notice);
    });
    var options = row.options && row.options.length
      ? field('options', row.options.join(' · '), { testid: 'waiting-options' }) : null;
    return el('article', {
      class: 'card waiting', testid: 'waiting-card', data: { 'slot-key': row.slot_key }
    }, [
      el('div', { class: 'card-head' }, [identifierNode(row)]),
      el('p', { class: 'question', testid: 'waiting-question', text: row.question }),
      el('div', { class: 'fields' }, [
        field('asked', ticking('since', row.asked_at)),
        options,
        field('on tracker', row.posted ? 'posted' : 'not yet')
      ]),
      box, button, notice
    ]);
  }

  function sendAnswer(row, text, button, notice) {
    if (!text.trim()) {
      notice.textContent = 'Write an answer first.';
      notice.hidden = false;
      return;
    }
    var headers = { Accept: 'application/json', 'Content-Type': 'application/json' };
    var token = storedToken();
    if (token) headers.Authorization = 'Bearer ' + token;
    button.disabled = true;
    notice.hidden = true;
    fetch('/api/v1/issues/' + encodeURIComponent(row.identifier) + '/answer', {
      method: 'POST', headers: headers,
      body: JSON.stringify({ text: text, source: 'dashboard' })
    })
      .then(function (response) {
        if (response.ok) {
          delete answerDrafts[row.slot_key];
          notice.hidden = true;
          return null;
        }
        return response.json().then(function (body) {
          var error = (body && body.error) || {};
          notice.textContent = response.status === 401
            ? 'Answering needs the server\'s token: open this page as ' +
              window.location.origin + '/#token=<the token file beside the lease>'
            : 'Answer refused (' + (error.code || response.status) + '): ' + (error.message || '');
          notice.hidden = false;
        });
      })
      .catch(function () {
        notice.textContent = 'The server could not be reached; try again.';
        notice.hidden = false;
      })
      .then(function () { button.disabled = false; });
  }

  function renderHistory(rows) {
    setText('history-count', String(rows.length));
    var body = $('history-table').querySelector('tbody');
    var fragment = document.createDocumentFragment();
    if (!rows.length) {
      fragment.appendChild(el('tr', { class: 'empty' }, [
        el('td', { text: 'no finished runs yet' })
      ]));
      fragment.firstChild.firstChild.setAttribute('colspan', '8');
    }
    rows.forEach(function (row) {
      var usage = row.usage || {};
      var detail = row.error || [row.host, row.session_id].filter(Boolean).join(' · ');
      fragment.appendChild(el('tr', {
        testid: 'history-row', data: { outcome: row.outcome, identifier: row.identifier }
      }, [
        el('td', { class: 'time', text: formatClock(row.finished_at), title: row.finished_at }),
        el('td', { class: 'identifier', text: row.identifier }),
        el('td', { text: row.slot }),
        el('td', { text: row.attempt === null || row.attempt === undefined ? '—' : row.attempt }),
        el('td', {}, [el('span', {
          class: 'outcome outcome-' + row.outcome, testid: 'history-outcome', text: row.outcome
        })]),
        el('td', { class: 'num', text: formatDuration(row.duration_ms) }),
        el('td', { class: 'num', text: formatInt(usage.input_tokens) + ' / ' + formatInt(usage.output_tokens) }),
        el('td', { class: 'detail' + (row.error ? ' error' : ''), text: detail, title: detail })
      ]));
    });
    body.replaceChildren(fragment);
  }

  function renderEvents(events) {
    var list = $('events-list');
    var fragment = document.createDocumentFragment();
    if (!events.length) fragment.appendChild(el('li', { class: 'empty', text: 'nothing yet' }));
    events.forEach(function (event) {
      var type = String(event.type || 'event');
      var tone = BAD_EVENTS[type] ? 'bad' : GOOD_EVENTS[type] ? 'good' : QUIET_EVENTS[type] ? 'quiet' : 'info';
      fragment.appendChild(el('li', {
        class: 'event tone-' + tone, testid: 'event-row', data: { type: type }
      }, [
        el('span', { class: 'time', text: formatClock(event.at), title: event.at }),
        el('span', { class: 'type', text: type }),
        event.identifier ? el('span', { class: 'identifier', text: event.identifier }) : null,
        el('span', { class: 'message', text: event.message || '', title: event.message || '' })
      ]));
    });
    list.replaceChildren(fragment);
  }

  function renderFooter(s) {
    setText('generated-at', 'snapshot ' + formatClock(s.generated_at));
    setText('log-file', s.log_file ? 'event log ' + s.log_file : '');
    var elsewhere = (s.claimed_elsewhere || []).length;
    setText('claimed-elsewhere', elsewhere ? elsewhere + ' slot(s) claimed by other owners' : '');
  }

  // ------------------------------------------------------------------ data flow

  function apply(snapshot) {
    if (!snapshot || typeof snapshot !== 'object') return;
    var at = parseIso(snapshot.generated_at);
    if (isFinite(at)) {
      // NB: a poll answer can overtake a stream message; never step back to an older picture.
      if (current && at < currentAt) return;
      currentAt = at;
      clockOffsetMs = at - Date.now();
    }
    current = snapshot;
    snapshotCount += 1;
    if (!renderScheduled) {
      renderScheduled = true;
      // rAF coalesces bursts of snapshots into one paint; the timer covers hidden tabs.
      window.requestAnimationFrame(function () { if (renderScheduled) render(); });
      window.setTimeout(function () { if (renderScheduled) render(); }, 250);
    }
  }

  function setMode(mode) {
    var node = $('connection');
    node.setAttribute('data-mode', mode);
    node.textContent = { live: 'live', polling: 'polling', offline: 'offline', connecting: 'connecting' }[mode] || mode;
  }

  function pollOnce() {
    return fetch(STATE_URL, { cache: 'no-store', headers: { Accept: 'application/json' } })
      .then(function (response) {
        if (!response.ok) throw new Error('HTTP ' + response.status);
        return response.json();
      })
      .then(function (snapshot) {
        if (!source || source.readyState !== 1) setMode('polling');
        apply(snapshot);
      })
      .catch(function () { setMode('offline'); });
  }

  function startPolling() {
    if (pollTimer !== null) return;
    pollOnce();
    pollTimer = window.setInterval(pollOnce, POLL_FALLBACK_MS);
  }

  function stopPolling() {
    if (pollTimer === null) return;
    window.clearInterval(pollTimer);
    pollTimer = null;
  }

  function onStreamMessage(message) {
    var snapshot;
    try {
      snapshot = JSON.parse(message.data);
    } catch (err) {
      return;
    }
    stopPolling();
    setMode('live');
    apply(snapshot);
  }

  function connect() {
    if (typeof window.EventSource !== 'function') {
      startPolling();
      return;
    }
    source = new EventSource(EVENTS_URL);
    source.addEventListener('snapshot', onStreamMessage);
    source.onmessage = onStreamMessage;
    source.onerror = function () {
      // The stream is down (server restarting, proxy cut it): keep the page current by polling
      // until it is back. EventSource reconnects by itself unless it gave up (CLOSED).
      startPolling();
      if (source && source.readyState === 2) {
        source.close();
        source = null;
        window.setTimeout(connect, SSE_RETRY_MS);
      }
    };
  }

  // The server's bearer token (state-changing routes need it over TCP). It arrives once in the
  // address fragment (#token=..., never sent to any server), is kept for this tab only, and
  // the fragment is removed from the address bar and history.
  function takeToken() {
    var match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash || '');
    if (match) {
      try { window.sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1])); } catch (e) { }
      window.history.replaceState(null, '', window.location.pathname + window.location.search);
    }
  }

  function storedToken() {
    try { return window.sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
  }

  function showRefreshNotice(text) {
    var notice = $('refresh-notice');
    notice.textContent = text || '';
    notice.hidden = !text;
  }

  function requestRefresh() {
    var button = $('refresh-button');
    var headers = { Accept: 'application/json' };
    var token = storedToken();
    if (token) headers.Authorization = 'Bearer ' + token;
    button.disabled = true;
    fetch(REFRESH_URL, { method: 'POST', headers: headers })
      .then(function (response) {
        if (response.status === 401) {
          showRefreshNotice('Refresh needs the server\'s token: open this page as ' +
            window.location.origin + '/#token=<the token file beside the lease>');
        } else if (!response.ok) {
          showRefreshNotice('Refresh refused (' + response.status + ')');
        } else {
          showRefreshNotice('');
        }
      })
      .catch(function () { /* the next snapshot shows whether it happened */ })
      .then(function () { window.setTimeout(function () { button.disabled = false; }, 500); });
  }

  function start() {
    takeToken();
    $('refresh-button').addEventListener('click', requestRefresh);
    connect();
    window.setInterval(tick, TICK_MS);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
