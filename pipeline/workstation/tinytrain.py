"""How the builtin tiny models learn: a BPE tokenizer trained on the shipped corpus and a few hundred steps of
next-token training on it, deterministically (shared by the text builtins, tinymodel.py, and the vision-language
ones, tinyvlm.py)."""

from __future__ import annotations

from pipeline.texts import CORPUS_DIR  # the shipped corpora: one place says where


def corpus_text(name: str) -> str:
    path = CORPUS_DIR / f"{name}.txt"
    if not path.is_file():
        known = ", ".join(p.stem for p in CORPUS_DIR.glob("*.txt"))
        from pipeline.errors import PipelineError
        raise PipelineError(f"no builtin corpus {name!r}", f"builtin corpora: {known}")
    return path.read_text(encoding="utf-8")


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on the shipped corpus, deterministically."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = corpus_text("calib-en").splitlines()
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def chat_turns(tokenizer) -> list[int]:
    """The corpus as short chats, rendered with the tokenizer's chat template: each line asked by the user and
    answered by the assistant with the first sentence of the next line, ended as the template ends a turn. A model
    trained on these ends its answers by itself (an agent's turn must end, not run to max_tokens)."""
    lines = [line.strip() for line in corpus_text("calib-en").splitlines() if line.strip()]
    ids: list[int] = []
    for ask, answer in zip(lines, lines[1:], strict=False):
        reply = answer.split(". ")[0].rstrip(".") + "."
        ids += tokenizer.apply_chat_template([{"role": "user", "content": ask[:200]},
                                              {"role": "assistant", "content": reply[:120]}], tokenize=True,
                                             add_generation_prompt=False, return_dict=False)
    return ids


def train(model, tokenizer, steps: int, seed: int, progress=None, chats: bool = False) -> None:
    """A few hundred steps of next-token training on the shipped corpus (seconds on one CPU core); `chats`: on the
    corpus as short chats (chat_turns) instead of as running text."""
    model.train()
    train_on_windows(model.parameters(), lambda x: model(input_ids=x, labels=x).loss,
                     chat_turns(tokenizer) if chats else tokenizer(corpus_text("calib-en"))["input_ids"], steps, seed,
                     progress)


def train_on_windows(params, loss_of, ids: list[int], steps: int, seed: int, progress=None) -> None:
    """`steps` AdamW steps (lr 3e-3) of loss_of(x) over batches of 16 random 32-token windows x of ids, drawn from a
    generator seeded with `seed`, on one thread: the same bits on every machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokens = torch.tensor(ids, dtype=torch.long)
        seq, batch = 32, 16
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
        for step in range(steps):
            starts = torch.randint(0, len(tokens) - seq - 1, (batch,), generator=gen)
            loss = loss_of(torch.stack([tokens[s:s + seq] for s in starts]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if progress:
                progress(step + 1, steps, loss.item())
    finally:
        torch.set_num_threads(threads)
