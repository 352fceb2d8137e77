// Runs bench/bench_tokenizer.py and the golden tokenizer check inside Pyodide (Node.js).
//
//   node bench/page/pyodide_bench_tokenizer.mjs SECTIONS_JSON [PYODIDE_DIR]
//
// SECTIONS_JSON holds {"tokenizer": {...}} (the model manifest's tokenizer
// section); PYODIDE_DIR defaults to node_modules/pyodide. Only the standard
// library is needed, so no Pyodide package is loaded. Prints the benchmark
// JSON plus {"golden_entries", "golden_mismatches"} measured under Pyodide.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const [sectionsPath, pyodideDir = join(root, "node_modules", "pyodide")] = process.argv.slice(2);
if (!sectionsPath) {
  console.error("usage: node bench/page/pyodide_bench_tokenizer.mjs SECTIONS_JSON [PYODIDE_DIR]");
  process.exit(2);
}
const { loadPyodide } = await import(join(resolve(pyodideDir), "pyodide.mjs"));
const pyodide = await loadPyodide({ indexURL: resolve(pyodideDir) + "/" });

const files = {
  "/work/py/pagedkv/__init__.py": "py/pagedkv/__init__.py",
  "/work/py/pagedkv/pretokenize.py": "py/pagedkv/pretokenize.py",
  "/work/py/pagedkv/tokenizer.py": "py/pagedkv/tokenizer.py",
  "/work/py/pagedkv/bpe.py": "py/pagedkv/bpe.py",
  "/work/py/pagedkv/spm.py": "py/pagedkv/spm.py",
  "/work/bench/bench_tokenizer.py": "bench/bench_tokenizer.py",
  "/work/tests/golden/tokenizer_golden.json": "tests/golden/tokenizer_golden.json",
};
for (const dir of ["/work", "/work/py", "/work/py/pagedkv", "/work/bench", "/work/tests", "/work/tests/golden"]) {
  pyodide.FS.mkdirTree(dir);
}
for (const [dest, src] of Object.entries(files)) {
  pyodide.FS.writeFile(dest, readFileSync(join(root, src)));
}
pyodide.FS.writeFile("/work/sections.json", readFileSync(sectionsPath));

const out = pyodide.runPython(`
import json, sys
sys.path[:0] = ["/work/py", "/work/bench"]
import bench_tokenizer
from pagedkv.tokenizer import Tokenizer
sections = json.load(open("/work/sections.json", encoding="utf-8"))
result = bench_tokenizer.run(sections, bench_tokenizer.bench_text(), 3)
tok = Tokenizer.from_manifest(sections)
golden = json.load(open("/work/tests/golden/tokenizer_golden.json", encoding="utf-8"))["entries"]
result["golden_entries"] = len(golden)
result["golden_mismatches"] = [e["name"] for e in golden if tok.encode(e["text"]) != e["ids"]]
json.dumps(result)
`);
console.log(out);
