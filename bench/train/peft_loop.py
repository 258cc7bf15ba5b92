"""peft_loop.py: the PyTorch + PEFT peer's training loop, shared by the training benchmarks
(train_cpu.py, train_families.py): the examples as token ids (EOS appended, cut to seq), an
order from numpy's legacy generator seeded with 0 (permutations of the examples, epoch after
epoch), and each step timed around forward, backward and the optimizer's step."""
import json
import os
import time


def load_examples(tok, data, seq):
    import torch
    examples = []
    for line in open(os.path.join(data, "train.jsonl")):
        ids = tok.encode(json.loads(line)["text"])
        if ids[-1] != tok.eos_token_id:
            ids.append(tok.eos_token_id)
        examples.append(torch.tensor([ids[:seq]]))
    return examples


def timed_steps(model, opt, examples, steps):
    """Yields (step, example index, loss, seconds) for steps steps."""
    import numpy as np
    np.random.seed(0)
    order = []
    while len(order) < steps:
        order += [int(i) for i in np.random.permutation(len(examples))]
    for step, i in enumerate(order[:steps], 1):
        x = examples[i]
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield step, i, loss.item(), time.perf_counter() - t0
