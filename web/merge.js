// Merging a chat's record when two tabs wrote it: `stored` is what another tab wrote, `ours` this tab's record
// now, `base` this tab's record when it last wrote (or took) the stored one. The turns this tab added since
// `base` go after the stored ones, as messages and as the exact token history (checkpoint): a turn's tokens
// start with the template's turn marker, so they mean the same after any earlier turn. A reply still
// streaming stays last. When this tab's history does not go on from `base` (a Regenerate rewrote it) or
// there is no history to go on from, no merge is made: null, and the caller keeps both as two chats.

const sameMessage = (a, b) => a.role === b.role && a.text === b.text;
const sameTurn = (a, b) => a.role === b.role && a.content === b.content;

/** The part of `rec` a merge may put turns after: all of it, or, while a reply streams, what came before the
 *  turn (store.beginTurn). */
function committed(rec) {
  if (rec.streaming && rec.turn_at !== undefined && rec.turn_base !== null && rec.turn_base !== undefined) {
    return { messages: rec.messages.slice(0, rec.turn_at), checkpoint: rec.turn_base, tail: true };
  }
  return { messages: rec.messages, checkpoint: rec.checkpoint, tail: false };
}

function startsWith(xs, prefix, same) {
  return xs.length >= prefix.length && prefix.every((x, i) => same(xs[i], x));
}

/** Whether checkpoint `c` goes on from checkpoint `from` (both [messages, ids, text]). */
function extendsCheckpoint(c, from) {
  if (from === null) return c === null;
  return c !== null && startsWith(c[0], from[0], sameTurn) && startsWith(c[1], from[1], (a, b) => a === b) &&
    c[2].startsWith(from[2]);
}

/** `onto` with what `c` has beyond `from` appended. */
function splice(onto, c, from) {
  return [[...onto[0], ...c[0].slice(from[0].length)], [...onto[1], ...c[1].slice(from[1].length)],
          onto[2] + c[2].slice(from[2].length)];
}

// The streaming turn of `rec` (its messages from turn_at, its checkpoint beyond turn_base), moved after `onto`.
function withTail(merged, rec) {
  const messages = rec.messages.slice(rec.turn_at);
  const before = rec.before_reply && extendsCheckpoint(rec.before_reply, rec.turn_base)
    ? splice(merged.checkpoint, rec.before_reply, rec.turn_base) : null;
  return { ...merged, messages: [...merged.messages, ...messages], turn_at: merged.messages.length,
           turn_base: merged.checkpoint, checkpoint: splice(merged.checkpoint, rec.checkpoint, rec.turn_base),
           before_reply: before, partial_ids: rec.partial_ids, streaming: true, turn_tab: rec.turn_tab };
}

// Each setting: this tab's value when it changed it since base, else the stored one (no base: the stored ones).
function mergeSettings(base, stored, ours) {
  if (!base || !ours) return stored;
  const merged = { ...(stored || {}) };
  for (const [key, value] of Object.entries(ours)) if (value !== base[key]) merged[key] = value;
  return merged;
}

/** The merged record, or null (see above). `tab`: this tab's id; a streaming turn in `stored` that this tab
 *  started (its turn_tab) is this tab's own, older than `ours`, and is dropped. */
export function mergeRecords(base, stored, ours, tab) {
  const theirs = committed(stored);
  const mine = committed(ours);
  const from = base ? committed(base) : { messages: [], checkpoint: null };
  const added = mine.messages.length - from.messages.length;
  if (added < 0 || !startsWith(mine.messages, from.messages, sameMessage) ||
      !extendsCheckpoint(mine.checkpoint, from.checkpoint)) return null;
  const nothingAdded = added === 0 && !mine.tail;
  if (!nothingAdded && (from.checkpoint === null || theirs.checkpoint === null)) return null;
  // A rename is this tab's when it made one since base, else the stored title stands; so is each setting, one
  // by one (a temperature changed here and a max_tokens changed in the other tab are both kept).
  const changed = (key) => base && JSON.stringify(ours[key]) !== JSON.stringify(base[key]);
  let merged = { ...stored, title: changed("title") ? ours.title : stored.title,
                 settings: mergeSettings(base?.settings, stored.settings, ours.settings),
                 messages: [...theirs.messages, ...mine.messages.slice(from.messages.length)],
                 checkpoint: nothingAdded ? theirs.checkpoint : splice(theirs.checkpoint, mine.checkpoint, from.checkpoint),
                 partial_ids: [], streaming: false };
  delete merged.turn_at;
  delete merged.turn_base;
  delete merged.turn_tab;
  // Regenerate's starting point: this tab's, when its last reply is the last one; else the other tab's.
  merged.before_reply = added > 0 && ours.before_reply && extendsCheckpoint(ours.before_reply, from.checkpoint)
    ? splice(theirs.checkpoint, ours.before_reply, from.checkpoint) : (added > 0 ? null : stored.before_reply);
  if (mine.tail) merged = withTail(merged, ours);
  else if (theirs.tail && stored.turn_tab !== tab) merged = withTail(merged, stored);
  return merged;
}
