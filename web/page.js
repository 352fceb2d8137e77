// The page's two handles: the element by id, and the root whose dataset is the page-state contract that
// tools and tests read (state, stage, model, modelInfo, chat, generating, lastTurn, memory, ...). The page
// writes that contract; it never reads its own state back from it.
export const root = document.documentElement;
export const $ = (id) => document.getElementById(id);
