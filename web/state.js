// The UI's state, in one place: the chats as their IndexedDB records hold them (store.js owns the records),
// what the worker says about their sessions (a reply streaming), and what only the page knows (the chat in view,
// text sent but not yet started). The DOM and the page-state
// dataset are rendered from it, never read back into it.
export const ui = {
  engine: null,         // pagedkv.js's engine (main.js opens it)
  modelInfo: null,      // the worker's model-ready message
  accepting: false,     // the model is ready and the chats are listed: a message goes to the worker at once
  queued: null,         // {chat, text}: a message sent while the model loads, sent when it is ready
  list: [],             // [{id, title}] this model's chats, in the order they were made (before the model
                        // is loaded: the saved chats, as IndexedDB holds them, in the order they were made)
  current: null,        // id of the chat in view
  newChatWanted: false, // New chat clicked before the model was in: made once its chats are known
  messages: {},         // chat id -> [{role, text, engine?, interrupted?}]
  busy: {},             // chat id -> true while a reply (or alternatives) streams
  pending: {},          // chat id -> {text} sent (or {reply} Regenerate took away) that the worker has not started
  handedBack: {},       // chat id -> text the worker refused while another chat was in view: the box gets it there
  settings: {},         // chat id -> its generation settings (the form's fields)
  partialIds: {},       // chat id -> token ids of the reply streaming now
  partialSaved: {},     // chat id -> true once the reply streaming now has been saved
  foreign: {},          // chat id -> {id, title, model}: a saved chat of another model, read-only here
  alternatives: {},     // chat id -> {texts, state: "streaming" | "done" | "abort"}
};

/** The chats in the list: this model's, then other models' (read-only). */
export function listed() {
  return [...ui.list, ...Object.values(ui.foreign)];
}
