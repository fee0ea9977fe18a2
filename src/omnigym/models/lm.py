"""Language models: load any Hugging Face causal LM and its tokenizer, optionally with
LoRA, and build tiny offline models that go through the very same loading path."""

from __future__ import annotations

import json
import string
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from omnigym.errors import OmnigymError, a_run, missing_extra
from omnigym.track.model_folder import resumed_line

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ("<pad>", "<unk>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise missing_extra("transformers", "llm") from None
    return transformers


@dataclass
class LoraSettings:
    r: int = 0
    """LoRA rank; 0 trains all weights"""
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str = "all-linear"


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool, where: str | None = None) -> str:
    """``messages`` through the tokenizer's chat template, as text. A template that raises on
    them (its own ``raise_exception``, e.g. Mistral-style "System role not supported", or a
    variable it does not have) is one line naming the row (``where``): it was a jinja2 traceback."""
    import jinja2

    place = f"{where}: " if where else ""
    if not messages:  # transformers' ValueError, a 500 from serve-rm
        raise OmnigymError(f"{place}the conversation has no messages; give at least one")
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    except jinja2.TemplateError as exc:
        raise OmnigymError(f"{place}the chat template refused these messages ({type(exc).__name__}: {exc}); give a "
                           "template that renders them (--chat-template), or data it accepts") from None


def read_chat_template(given: str) -> str:
    """``--chat-template``: a Jinja template, or a file that holds one; checked to compile."""
    import jinja2

    path = Path(given).expanduser()
    try:
        is_file = "\n" not in given and path.is_file()
    except OSError:  # a template longer than a file name can be (ENAMETOOLONG) is not a path
        is_file = False
    if is_file:
        try:
            given = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise OmnigymError(f"--chat-template {given}: cannot be read ({type(exc).__name__})") from None
    elif "{" not in given:
        raise OmnigymError(f"--chat-template {given}: no such file, and not a Jinja template")
    try:
        jinja2.Environment().parse(given)
    except jinja2.TemplateSyntaxError as exc:
        raise OmnigymError(f"--chat-template does not compile: {exc.message} (line {exc.lineno})") from None
    return given


def check_template_writes_the_messages(tokenizer) -> None:
    """A ``--chat-template`` that never writes the messages' content (``{{ 'hello' }}``) made every
    prompt the same text: GRPO trained on it in silence, and SFT blamed --max-length."""
    try:
        first, second = (tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                       add_generation_prompt=True) for text in ("2 + 2", "3 + 5"))
    except Exception:  # a template that refuses a lone user turn is judged on the data's own rows
        return
    if first == second:
        raise OmnigymError("--chat-template renders the same text whatever the messages say (it never writes "
                           "their content); give a template that writes each message, e.g. with "
                           "{% for m in messages %}{{ m['content'] }}{% endfor %}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json", "vocab.txt", "spiece.model",
                   "merges.txt", "sentencepiece.bpe.model")
"""what a saved tokenizer leaves in its folder, in one format or another"""


def load_tokenizer(name_or_path: str, chat_template: str | None = None, need_chat_template: bool = True):
    """Tokenizer with left padding (for batched generation) and a chat template.

    A model without a chat template needs one given (a Jinja string or a file with one),
    unless ``need_chat_template`` is False (plain-text fine-tuning).
    """
    transformers = _transformers()
    folder = Path(name_or_path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # transformers' own sentence ended at "Couldn't instantiate the backend tokenizer from one of: "
        raise LoadFailed(f"{name_or_path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); save the "
                         "tokenizer into the model's folder (tokenizer.save_pretrained(folder))")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
    except LOAD_ERRORS as exc:
        raise LoadFailed(f"cannot load a tokenizer from {name_or_path}: {first_line(exc)}") from None
    except Exception as exc:  # the tokenizers library raises a bare Exception on a damaged tokenizer.json
        if type(exc) is not Exception:
            raise
        raise LoadFailed(f"cannot load a tokenizer from {name_or_path}: {first_line(exc)}") from None
    if chat_template:
        tokenizer.chat_template = read_chat_template(chat_template)
        check_template_writes_the_messages(tokenizer)
    if need_chat_template and not getattr(tokenizer, "chat_template", None):
        raise OmnigymError(f"{name_or_path} has no chat template; give one with --chat-template "
                           "(a Jinja string or a file that holds one)")
    if tokenizer.eos_token is None:  # it ends every reply and sequence: without it, a traceback in the first batch
        raise OmnigymError(f"the tokenizer of {name_or_path} has no end-of-sequence token, which ends every reply; "
                           "set one (tokenizer.eos_token = ...) and save it again")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # safe: every batch carries an attention mask
    tokenizer.padding_side = "left"
    return tokenizer


class LoadFailed(OmnigymError):
    """transformers could not load a folder that passed ``check_model_folder``; the caller says
    which flag named it"""


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


ENCODER_ONLY = frozenset({"bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "electra", "ernie", "rembert",
                          "roformer", "bert-generation", "data2vec-text", "xmod", "megatron-bert", "big_bird", "nezha",
                          "qdqbert", "mra", "modernbert"})
"""model types ``AutoModelForCausalLM`` loads whose attention is bidirectional unless ``is_decoder``"""


def check_vocabulary(model, tokenizer, name: str) -> None:
    """Every token the tokenizer writes has a row in the model's embedding table (a table cut shorter
    than the tokenizer was an IndexError in the first forward pass)."""
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):  # a model without a token table to compare (the LSTM's own)
        return
    if len(tokenizer) > rows:
        raise OmnigymError(f"--model {name}: its tokenizer has {len(tokenizer)} tokens and its embedding table {rows} "
                           f"rows, so token ids {rows} and up have no embedding; resize the model to its tokenizer "
                           "(model.resize_token_embeddings(len(tokenizer))) and save it again")


def load_model(name_or_path: str, lora: LoraSettings | None = None, dtype: str = "float32", device: str = "cpu"):
    transformers = _transformers()
    import torch

    from omnigym.models.lstm_lm import register

    register()  # a saved --model lstm loads like any other folder

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    except LOAD_ERRORS as exc:
        raise LoadFailed(f"cannot load a model from {name_or_path}: {first_line(exc)}") from None
    if model.config.model_type in ENCODER_ONLY and not getattr(model.config, "is_decoder", False):
        # transformers loads them as causal LMs, with attention that reads later tokens: trained and sampled
        # without a word, and wrong
        raise LoadFailed(f"a {model.config.model_type} model reads all of its input at once (its config's is_decoder "
                         "is false), so it cannot write text a token at a time; omnigym trains causal language models "
                         "(Llama, Qwen2, GPT-2, ...)")
    model.to(device)
    if lora is not None and lora.r > 0:
        from omnigym.models.lstm_lm import MODEL_TYPE

        if model.config.model_type == MODEL_TYPE:  # a saved --model lstm folder: peft finds no layer to adapt
            raise OmnigymError(f"--lora-r adapts a transformer's attention and MLP layers, which the LSTM policy "
                               f"{name_or_path} has none of; leave --lora-r out (the LSTM trains whole)")
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise missing_extra("peft", "llm") from None
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    return model


TINY_MODELS = MappingProxyType({"tiny": MappingProxyType({}), "tiny-small": MappingProxyType({"hidden": 64})})
"""the models ``--model`` builds offline, by name: ``build_tiny_model``'s sizes. "tiny-small" (0.27M
parameters, a quarter of "tiny"'s 1.06M: half the width, the same 4 layers and character tokenizer)
is the student of ``omnigym train distill``'s demo, whose teacher is a "tiny" model trained by GRPO"""


@contextmanager
def model_folder(name_or_path: str, seed: int = 0, lstm_hidden: int = 128, score_head: bool = False):
    """The folder (or hub id) ``--model`` names, for as long as the ``with`` block loads from it:
    "tiny" is built offline into a temporary folder (the same weights for the same seed), the
    run directory of an earlier omnigym run is its ``model/`` folder; a path that is not a
    model is refused in one line (a reward model too, unless it is loaded with a ``score_head``).
    "lstm" is an LSTM LM of ``lstm_hidden`` units built offline the same way (``models/lstm_lm.py``)."""
    if name_or_path == "lstm":
        with lstm_model_folder(seed, lstm_hidden) as folder:
            yield folder
        return
    if name_or_path in TINY_MODELS:
        from omnigym.distributed import barrier, broadcast, is_main_process, share_random_state

        with tempfile.TemporaryDirectory() as folder:
            # transformers writes model files from the first process of a data-parallel run
            # only: it builds the model, the others load its folder
            if is_main_process():
                build_tiny_model(folder, seed=seed, **TINY_MODELS[name_or_path])
            shared = broadcast(folder)
            share_random_state()  # building seeds torch: every process goes on from the same state
            yield shared
            barrier()  # the folder goes once every process has loaded it
        return
    yield resolve_model(name_or_path, score_head=score_head)


def model_path(name_or_path: str) -> Path:
    """Where a model folder would be: the path itself, or a run directory's ``model/`` (an earlier
    run or stage: omnigym train sft ...). May raise OSError (a name too long for the file system)."""
    path = Path(name_or_path).expanduser()
    if (path / "model" / "config.json").is_file() and not (path / "tokenizer_config.json").exists():
        return path / "model"
    return path


def tiny_family(name_or_path: str, chat_template: str | None = None) -> bool:
    """``--model`` is a built-in tiny model, or a folder or run of their family (a model saved by a
    run that started from one: it carries their chat template). They learn the answer format from
    the warm-up's demonstrations, shown no system prompt, so none is shown to them later either: a
    GRPO or distillation run from a warmed-up tiny folder, told the format in a system prompt it was
    never trained with, wrote garbage (held-out accuracy 0.02 where its own run measured 0.68).

    A ``chat_template`` given (``--chat-template``) decides instead: it is what the run renders with
    and saves in its model/, which ``omnigym eval RUN`` and ``--model RUN`` read later. Judged by the
    folder alone, GRPO from a tiny folder with another template trained with no system prompt and
    its own eval showed the format (pass@1 0.000 where it trained at 0.150)."""
    if chat_template is not None:
        return tiny_template(read_chat_template(chat_template))
    if name_or_path in TINY_MODELS:
        return True
    try:
        path = model_path(name_or_path)
        saved = (path / "chat_template.jinja").read_text() if (path / "chat_template.jinja").is_file() else \
            json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):  # not a folder, or no readable tokenizer: a hub id or another model
        return False
    return isinstance(saved, str) and tiny_template(saved)


def tiny_template(template: str) -> bool:
    """``template`` renders as the tiny models' own: Jinja drops a template's one trailing newline
    (an editor adds one on save), so a copy that ends with one is theirs and is not told the format
    in a system prompt (it was: held-out accuracy 0.000 for 0.100 without)."""
    return template.removesuffix("\n") == CHAT_TEMPLATE


def resolve_model(name_or_path: str, label: str | None = None, score_head: bool = False) -> str:
    """``name_or_path``'s model folder (a run directory's ``model/``), or the hub id as given;
    ``label`` names it in the one-line refusals (default ``--model NAME``). A reward model is
    refused unless it is to be loaded with a ``score_head`` (train rm/prm's base, RLHF's critic)."""
    label = label or f"--model {name_or_path}"
    if not name_or_path.strip():  # "" is Path("."): the current directory was read as the model folder
        raise OmnigymError(f"{label.strip()} is empty; give a folder saved with save_pretrained, or a hub id")
    try:
        path = model_path(name_or_path)
        exists = path.exists()
    except OSError as exc:  # a name longer than a file name can be (ENAMETOOLONG) was a traceback
        raise OmnigymError(f"{label}: no such folder ({exc.strerror}); give a folder saved with save_pretrained, "
                           "or a hub id") from None
    # a hub id has at most one "/" (namespace/name): runs/x/model is a misspelt folder, not an id, and so is
    # runs/x where runs/ is a folder here (it was read as a hub id: "couldn't connect to huggingface.co")
    looks_like_path = (name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1 or exists
                       or ("/" in name_or_path and Path(name_or_path).expanduser().parent.is_dir()))
    if looks_like_path and not path.is_dir():
        raise OmnigymError(f"{label}: no such folder; give a folder saved with save_pretrained, "
                           "or a hub id")
    if looks_like_path and not (path / "config.json").exists():
        raise OmnigymError(f"{label} has no config.json; give a folder saved with save_pretrained, "
                           "or the directory of a finished omnigym run")
    if looks_like_path and resumed_line(path) is not None:  # a resumed run's model/ from before the resume
        raise OmnigymError(f"{label}: {resumed_line(path)}")
    if looks_like_path:
        check_model_folder(label, path)
        if not score_head and (path / REWARD_MODEL_MARKER).is_file():  # it loaded as a language model, its score head left out, in silence
            raise OmnigymError(f"{label}: {path} is a reward model (a score head, no language-model head); give a "
                               f"language model: a model folder, a hub id, or a finished "
                               f"{MODEL_RUNS.replace('rm, prm, ', '')} run")
        return str(path)
    check_hub_id(label, name_or_path)
    return name_or_path


def check_hub_id(label: str, hub_id: str) -> None:
    """A name that is no folder here loads from the Hugging Face hub only if it can: from its
    cache, or from a hub that answers and holds it. Otherwise one line now: transformers tried
    each file five times over ~23 s, printing every retry (a misspelt ``--model`` was 22 lines
    of them before its error)."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    fix = "give a folder saved with save_pretrained, or a hub id"
    try:
        if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
            return
    except HFValidationError:
        raise OmnigymError(f"{label}: no such folder here, and not a hub id; {fix}") from None
    if constants.HF_HUB_OFFLINE:
        raise OmnigymError(f"{label}: no such folder here, and not in the Hugging Face cache (HF_HUB_OFFLINE is "
                           f"set, so nothing is downloaded); {fix}")
    try:
        HfApi().model_info(hub_id, timeout=10)
    except GatedRepoError:
        return  # transformers says what access it needs
    except RepositoryNotFoundError:
        raise OmnigymError(f"{label}: no such folder here, and no such model on {constants.ENDPOINT} (a private "
                           f"one needs `hf auth login`); {fix}") from None
    except Exception as exc:  # whatever the network raises: the hub cannot be asked
        raise OmnigymError(f"{label}: no such folder here, not in the Hugging Face cache, and {constants.ENDPOINT} "
                           f"cannot be reached to fetch it ({first_line(exc)}); {fix}") from None


def refuse_run_directory(label: str, config_file: Path, config: dict) -> None:
    """``label``'s folder holds an omnigym run's config.json, not a model's: one line saying what
    to give instead, rather than a tokenizer traceback from reading it as a model config.

    A run that trains a language model through a training backend (its config has
    ``training_backend``: every ``LanguageModelConfig``) writes ``model/`` when it finishes
    (``FINAL_MODEL``); the others write none. That is read from the run's own config, not
    from the algorithm registry, which sits in ``algos/``, layers above the models
    (``tests/test_architecture.py`` checks the two agree for every algorithm)."""
    algo = str(config["algo"])
    if "training_backend" in config:
        from omnigym.track.lock import RunLock

        # still training (sample of a running sft run was told to --resume it): the lock names its process
        probe = RunLock(config_file.parent)
        probe.acquire()
        probe.release()
        # it stopped, or the disk filled, while writing its final model/
        raise OmnigymError(f"{label}: the run has no finished model (its model/ was not written whole); "
                           f"finish it with: omnigym train {algo} --resume {label.split(' ', 1)[-1]}")
    raise OmnigymError(f"{label}: {config_file} is {a_run(algo)}'s config, and {a_run(algo)} writes no model folder; "
                       f"give a model folder, a hub id, or the directory of a finished {MODEL_RUNS} run")


REWARD_MODEL_MARKER = "omnigym_reward.json"
"""the file a reward model's folder holds beside its weights (models/scalar_head.py writes it)"""

# the algorithms whose runs end with a model/ folder (tests/test_architecture.py checks it
# against the registry, which sits above this layer)
MODEL_RUNS = "sft, grpo, dpo, online_dpo, rm, prm, rlhf or distill"


LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, RuntimeError, AttributeError)
"""what transformers and tokenizers raise on a folder they cannot read (a JSONDecodeError is a
ValueError); turned into one line naming the folder"""


def check_model_folder(label: str, path: Path) -> None:
    """A local model folder is whole before anything loads from it: a model config, weights, and
    safetensors files whose header covers them (a copy cut short raises deep in transformers)."""
    import json

    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OmnigymError(f"{label}: {config_file} cannot be read ({type(exc).__name__}); "
                           "save or copy the model again") from None
    if isinstance(config, dict) and "algo" in config:
        refuse_run_directory(label, config_file, config)
    if not isinstance(config, dict) or "model_type" not in config:
        raise OmnigymError(f"{label}: {config_file} is not a model config (no model_type); give a folder "
                           "saved with save_pretrained")
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")) + sorted(path.glob("*.index.json"))
    if not weights:
        raise OmnigymError(f"{label}: {path} has no weights (model.safetensors or pytorch_model.bin); "
                           "save or copy the model again")
    from safetensors import safe_open

    for file in weights:
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt"):  # reads the header only
                    pass
            except Exception as exc:  # safetensors' own SafetensorError, or an OSError
                detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise OmnigymError(f"{label}: {file} is damaged or incomplete ({detail}); "
                                   "save or copy the model again") from None


def load_policy_and_tokenizer(name_or_path: str, seed: int = 0, chat_template: str | None = None,
                              lora: LoraSettings | None = None, device: str = "cpu", need_chat_template: bool = True,
                              lstm_hidden: int = 128):
    """The model and tokenizer of ``--model`` (``model_folder`` says what it may name)."""
    with model_folder(name_or_path, seed, lstm_hidden) as source:
        try:
            tokenizer = load_tokenizer(source, chat_template, need_chat_template)  # first: the cheaper failure
            model = load_model(source, lora, device=device)
        except LoadFailed as exc:
            raise OmnigymError(f"--model {name_or_path}: {exc}") from None
    check_vocabulary(model, tokenizer, name_or_path)
    return model, tokenizer


def check_context(model, max_new_tokens: int) -> None:
    """Refuse completions longer than the model can hold at all (before the run starts),
    instead of generating past its positions or for hours."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and max_new_tokens >= limit:
        raise OmnigymError(f"--max-new-tokens {max_new_tokens} does not fit the model's context of {limit} tokens "
                           "(prompt included); use fewer")


def learned_position_limit(model) -> int | None:
    """The positions a model cannot go past: ``max_position_embeddings`` where a table of learned
    position embeddings of that size holds them (GPT-2's ``wpe``; OPT's keeps 2 more rows), else
    None. A rotary (Llama-family) model computes any position and runs on past its context,
    degraded; a learned table has no row there, and sampling past it was an ``IndexError``."""
    import torch

    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    try:
        tokens = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # a model without a token table of its own to tell apart
        tokens = None
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module is not tokens and module.num_embeddings in (limit, limit + 2):
            return limit
    return None


def check_max_length(model, max_length: int) -> None:
    """``--max-length`` within a learned position table (``learned_position_limit``), before the run
    starts: longer sequences were an ``IndexError`` in the model's first forward pass."""
    limit = learned_position_limit(model)
    if limit is not None and max_length > limit:
        raise OmnigymError(f"--max-length {max_length} is more than the model's {limit} positions (its position "
                           f"embeddings are learned and end there): give --max-length {limit} or less")


def stripped_special_tokens(tokenizer, ids: list[int], mask: list[int] | None = None) -> dict:
    """What ``decode(ids, skip_special_tokens=True)`` leaves out without a word: how many special
    tokens the model wrote (``mask`` 1; the end-of-sequence token that ends a reply not counted)
    and the text with them kept. ``{}`` when there are none. Without it a reply of nothing but
    ``<|user|>`` tokens, cut at its length, reads as ``""``."""
    # all_special_ids misses a chat marker added as a special token (the Rust decoder skips it all the same)
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = ({i for i, token in added.items() if getattr(token, "special", False)}
               | set(tokenizer.all_special_ids)) - {tokenizer.eos_token_id}
    count = sum(1 for i, token in enumerate(ids) if token in special and (mask is None or mask[i]))
    if not count:
        return {}
    return {"special_tokens_stripped": count,
            "with_special_tokens": tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)}


def build_tiny_model(path: str | Path, hidden: int = 128, layers: int = 4, heads: int = 4,
                     max_positions: int = 256, seed: int = 0) -> Path:
    """A ~1M-parameter Llama with a character-level tokenizer and a chat template, saved with
    ``save_pretrained`` so that it loads like any hub model. A Llama config is used because
    ``AutoTokenizer`` wraps a ``qwen2`` folder's vocabulary in Qwen2's tokenizer, which drops
    a character tokenizer's spaces."""
    transformers = _transformers()
    import torch

    path = Path(path)
    tokenizer, vocab = build_tiny_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=vocab["<pad>"], eos_token_id=vocab["<|end|>"], bos_token_id=None)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.pad_token_id = vocab["<pad>"]
    model.generation_config.eos_token_id = vocab["<|end|>"]
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_tokenizer():
    """The tiny models' character-level tokenizer (printable ASCII and the special tokens) with
    a chat template, and its vocabulary."""
    transformers = _transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + list(dict.fromkeys(string.printable)))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                                     eos_token="<|end|>", padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer, vocab


@contextmanager
def lstm_model_folder(seed: int = 0, hidden: int = 128):
    """``--model lstm``: an untrained LSTM LM over the tiny models' tokenizer, built into a
    temporary folder for as long as the ``with`` block loads from it (by the first process of a
    data-parallel run; the others load its folder), as ``model_folder`` builds "tiny"."""
    _transformers()
    from omnigym.distributed import barrier, broadcast, is_main_process, share_random_state
    from omnigym.models.lstm_lm import build_lstm_model

    with tempfile.TemporaryDirectory() as folder:
        if is_main_process():
            build_lstm_model(folder, build_tiny_tokenizer()[0], hidden, seed)
        shared = broadcast(folder)
        share_random_state()  # building seeds torch: every process goes on from the same state
        yield shared
        barrier()
