"""Open a GGUF in the page: converted in the worker from File slices, refused by the ledger when it does not
fit, stored in OPFS, reopened after a reload, removed; a malformed file is an error and the page goes on."""
from __future__ import annotations

import json

import pytest
from gguf import GGUFValueType as V
from gguf_files import write_small_gguf, write_tiny_gguf

from browser_pages import BOOT_TIMEOUT_MS, open_app, show_settings, wait_model
from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.chat import ChatTemplate, Conversation
from pagedkv.model.convert import convert_gguf
from pagedkv.model.weights import ModelWeights, read_manifest
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.user_models import check_fits

FILE_NAME = "tiny-llama.gguf"
MODEL_ID = "gguf:tiny-llama.gguf"
PROMPT = "Hello there!"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / FILE_NAME
    write_tiny_gguf(path, seed=3)
    return path


@pytest.fixture(scope="module")
def reference(tiny_gguf, tmp_path_factory) -> dict:
    """The CPython numpy reference on the same file: the prompt's ids and the greedy reply's."""
    out = tmp_path_factory.mktemp("converted") / "tiny-llama"
    convert_gguf(tiny_gguf, out)
    manifest = read_manifest(out)
    tokenizer = Tokenizer.from_manifest(manifest)
    prompt = Conversation(tokenizer, ChatTemplate.from_manifest(manifest, tokenizer)).add_user(PROMPT)
    reply = greedy_reference(NumpyModel(ModelWeights.load(out)), prompt, MAX_TOKENS)
    return {"manifest": manifest, "prompt": prompt, "reply": reply}


# A file dropped on the page, as a person drags one from their file manager.
DROP = """([name, bytes]) => {
  const dt = new DataTransfer();
  dt.items.add(new File([new Uint8Array(bytes)], name));
  document.body.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
}"""


def wait_gguf(page, state: str) -> dict:
    page.wait_for_selector(f"html[data-gguf={state}], html[data-gguf=error]", state="attached",
                           timeout=BOOT_TIMEOUT_MS)
    return page.evaluate("Object.assign({}, document.documentElement.dataset)")


def wait_reloaded(booted) -> dict:
    """After the page navigated by itself (open, or a reload): wait for the boot and the model again."""
    page = booted.page
    page.wait_for_selector("html:not([data-state=booting])", state="attached", timeout=BOOT_TIMEOUT_MS)
    info = wait_model(booted)
    show_settings(page)
    return info


def chat_ids(booted, text: str) -> list[int]:
    """Send `text` with greedy settings in a new chat; the chat's token ids once the reply has ended."""
    page = booted.page
    shown = page.evaluate("document.documentElement.dataset.chat || ''")
    page.locator("#new-chat").click()
    for _ in range(600):  # the new chat comes into view once the worker made it (after its restore)
        if page.evaluate("document.documentElement.dataset.chat || ''") != shown:
            break
        page.wait_for_timeout(100)
    previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
    page.fill("#set-max-tokens", str(MAX_TOKENS))
    page.fill("#set-temperature", "0")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    for _ in range(3000):  # the page's CSP forbids wait_for_function's eval: poll
        if page.evaluate("document.documentElement.dataset.lastTurn || ''") != previous:
            break
        page.wait_for_timeout(100)
    chat = page.evaluate("document.documentElement.dataset.chat")
    return booted.py(f"import json\nfrom pagedkv_app.main import state\n"
                     f"json.dumps(state['service'].sessions[{chat!r}].conversation.ids)")


def assert_answers_like_reference(booted, reference) -> None:
    prompt, reply = reference["prompt"], reference["reply"]
    ids = chat_ids(booted, PROMPT)
    assert ids[:len(prompt)] == prompt
    assert ids[len(prompt):len(prompt) + MAX_TOKENS] == reply


def open_gguf(browser, base_url, tiny_gguf, reference, backend: str, query: str = ""):
    """The page on `backend` (and `query`), the GGUF opened through the file input: converted, stored, and
    answering."""
    booted, info = open_app(browser, f"{base_url}?model=tiny-random&backend={backend}{query}", 120_000)
    page = booted.page
    assert info["model"] == "tiny-random"
    page.set_input_files("#gguf-input", str(tiny_gguf))
    page.wait_for_url(lambda url: "model=gguf%3Atiny-llama.gguf" in url, wait_until="commit",
                      timeout=BOOT_TIMEOUT_MS)
    info = wait_reloaded(booted)
    assert (info["model"], info["backend"], info["layers"]) == (MODEL_ID, backend, 2)
    listed = json.loads(page.evaluate("document.documentElement.dataset.userModels"))
    assert listed == [{"id": MODEL_ID, "name": FILE_NAME, "bytes": tiny_gguf.stat().st_size}]
    assert_answers_like_reference(booted, reference)
    return booted


def test_an_opened_gguf_answers_on_webgpu(browser, base_url, tiny_gguf, reference):
    open_gguf(browser, base_url, tiny_gguf, reference, "webgpu").page.close()


def test_open_store_reload_and_remove(browser, base_url, tiny_gguf, reference):
    """Storing, reopening and removing do not depend on the backend: on the CPU path (each boot is shorter), with
    f32 activations, as the CPython reference computes."""
    backend, query = "cpu", "&activations=f32"
    booted = open_gguf(browser, base_url, tiny_gguf, reference, backend, query)
    page = booted.page

    page.reload()  # opens from OPFS: nothing is converted again
    info = wait_reloaded(booted)
    assert info["model"] == MODEL_ID
    assert page.locator(f"#model-list button[data-model='{MODEL_ID}']").get_attribute("aria-current") == "true"
    assert_answers_like_reference(booted, reference)

    page.locator(f"#model-list button[data-model='{MODEL_ID}'] + .remove-model").click()
    page.wait_for_selector("html[data-user-models='[]']", state="attached")
    page.goto(f"{base_url}?model=tiny-random&backend={backend}")
    wait_reloaded(booted)
    assert page.evaluate("document.documentElement.dataset.userModels") == "[]"
    page.goto(f"{base_url}?model={MODEL_ID}&backend={backend}")
    page.wait_for_selector("html[data-model=error]", state="attached", timeout=BOOT_TIMEOUT_MS)
    assert page.locator("#model-detail").inner_text() == (
        f"Could not load {MODEL_ID}: FileNotFoundError: the model {MODEL_ID} is not stored in this browser "
        "(removed, or its storing was interrupted): open its GGUF file again")
    page.close()


def test_too_big_for_the_budget_is_refused_and_the_model_in_use_answers(browser, base_url, tiny_gguf, reference):
    budget_mib = 6
    booted, info = open_app(browser, f"{base_url}?model=tiny-random&backend=webgpu&budget_mib={budget_mib}", 120_000)
    page = booted.page
    assert info["backend"] == "webgpu"
    limits = booted.py("import json\nfrom pagedkv_app.main import state\n"
                       "json.dumps(state['gpu'].info.limits['maxStorageBufferBindingSize'])")
    with pytest.raises(ValueError) as refused:
        check_fits(reference["manifest"], name=FILE_NAME, budget_bytes=budget_mib << 20, block_size=16,
                   kv_dtype="f16", max_binding=limits)
    assert "needs 17 MiB, budget 6 MiB" in str(refused.value)
    before = chat_ids(booted, PROMPT)
    page.set_input_files("#gguf-input", str(tiny_gguf))
    data = wait_gguf(page, "stored")
    assert data["gguf"] == "error" and data["ggufError"] == str(refused.value)
    assert page.locator("#gguf-status").inner_text() == str(refused.value)
    assert data["userModels"] == "[]" and page.url.endswith(f"budget_mib={budget_mib}")
    assert chat_ids(booted, PROMPT) == before  # the model in use still answers, the same way
    page.close()


def test_malformed_file_is_an_error_and_the_page_works(browser, base_url, tiny_gguf, tmp_path):
    booted, _ = open_app(browser, f"{base_url}?model=tiny-random&backend=cpu", 120_000)
    page = booted.page
    before = chat_ids(booted, PROMPT)
    hostile = {}  # tiny.py's model with one key made hostile (test_gguf_hostile.py has every case in CPython)
    for name, metadata in (("layers.gguf", {"llama.block_count": (1_000_000, V.UINT32)}),
                           ("heads.gguf", {"llama.attention.head_count": ("four", V.STRING)}),
                           ("template.gguf", {"tokenizer.chat_template": ("{% for i in range(10**9) %}{% endfor %}",
                                                                           V.STRING)})):
        write_small_gguf(tmp_path / name, metadata)
        hostile[name] = (tmp_path / name).read_bytes()
    cases = {  # dropped on the page, or picked with the file input
        "not-gguf.gguf": (b"GGML" + bytes(60), "drop",
                          "not-gguf.gguf is not a GGUF file: it starts with b'GGML', not b'GGUF'"),
        "notes.txt": (b"GGUF", "drop", "notes.txt is not a .gguf file"),
        "cut.gguf": (tiny_gguf.read_bytes()[:-100], "input", None),
        "layers.gguf": (hostile["layers.gguf"], "input", "layers.gguf: llama.block_count is 1,000,000 (an integer); "
                        "expected the number of layers the tensor table holds: 2 (blk.0..blk.1)"),
        "heads.gguf": (hostile["heads.gguf"], "input",
                       "heads.gguf: llama.attention.head_count is 'four' (a string); expected a positive integer"),
        "template.gguf": (hostile["template.gguf"], "input", "template.gguf: tokenizer.chat_template is refused: chat "
                          "template failed to render: it asked for range(1000000000) (1,000,000,000 items; at most "
                          "100,000 in one render)"),
    }
    for name, (raw, how, message) in cases.items():
        page.evaluate("delete document.documentElement.dataset.gguf")
        if how == "drop":
            page.evaluate(DROP, [name, list(raw)])
        else:
            (tmp_path / name).write_bytes(raw)
            page.set_input_files("#gguf-input", str(tmp_path / name))
        data = wait_gguf(page, "stored")
        assert data["gguf"] == "error"
        if message is None:
            size = tiny_gguf.stat().st_size  # the last tensor (128 x 64 in Q4_1: 5,120 bytes) ends the file
            message = (f"cut.gguf is truncated: tensor 'blk.1.ffn_down.weight' (Q4_1, shape [128, 64]) needs bytes "
                       f"{size - 5120:,}..{size:,} but the file has {size - 100:,}")
        assert data["ggufError"] == message and page.locator("#gguf-status").inner_text() == message
    assert json.loads(page.evaluate("document.documentElement.dataset.userModels")) == []
    assert chat_ids(booted, PROMPT) == before
    page.close()
