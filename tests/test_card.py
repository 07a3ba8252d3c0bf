"""The model card says what the scorer's config and provenance hold, nothing else."""

from pmi_reward.scoring.card import model_card

ENCODER = {"model": "minilm", "pooling": "mean", "max_length": 256}


def _rows(head: dict, metadata: dict | None = None) -> dict[str, str]:
    card = model_card({"encoder": ENCODER, "context_turns": 3, "head": head}, metadata or {})
    rows = [line.split(" | ") for line in card.splitlines() if line.startswith("| head")]
    return {cells[0].strip("| "): cells[1].strip("| ") for cells in rows}


def test_the_head_rows_follow_its_config():
    """The card said [u, v, u*v] without the product, never named the line features, and called a linear head
    (hidden=[]) "MLP not recorded (PReLU)"."""
    plain = _rows({"input_mode": "pair", "pair_product": False, "hidden": [256, 128], "cap": 20.0})
    assert plain["head input"] == "separate context and reply embeddings u, v, read as [u, v]"
    assert plain["head"] == "MLP 256 - 128 (PReLU), soft cap 20"
    lines = _rows({"input_mode": "pair", "pair_product": True, "line_turns": 2, "hidden": [], "cap": 20.0})
    assert "read as [u, v, u*v], plus the reply set against the context's 2 newest lines" in lines["head input"]
    assert lines["head"] == "one linear layer (no hidden layers), soft cap 20"
    residual = _rows({"input_mode": "pair", "residual": "cosine", "hidden": [], "cap": 5.0})
    assert (
        residual["head"]
        == "a * cos(u, v) + b (learned a, b) plus a correction by one linear layer (no hidden layers), soft cap 5"
    )
    residual = _rows({"input_mode": "pair", "residual": "cosine", "hidden": [64], "cap": 5.0})
    assert residual["head"] == "a * cos(u, v) + b (learned a, b) plus a correction by an MLP 64 (PReLU), soft cap 5"
    assert _rows({"input_mode": "pair", "cap": 5.0})["head"] == "MLP not recorded, soft cap 5"  # an old config
    prompt = _rows({"input_mode": "prompt", "hidden": [8], "cap": 5.0})
    assert prompt["head input"] == "one embedding of the pair prompt (context and reply in one text)"


def test_dialogues_and_pair_files_are_both_named():
    """A scorer trained on dialogues plus pair files (training pairs the union of the two) named only the dialogues."""
    data = {
        "dialogues": "chitchat",
        "n_dialogues": [240, 30, 30],
        "max_context_turns": 3,
        "train_file": "extra.jsonl",
        "val_file": "extra-val.jsonl",
    }
    card = model_card({"encoder": ENCODER, "head": {}}, {"data": data, "train_pairs": 900, "val_pairs": 100})
    assert "train / validation / test = 240 / 30 / 30" in card
    assert (
        "Pair files: train_file `extra.jsonl` (added to the dialogues' training pairs), val_file `extra-val.jsonl` "
        "(replacing the dialogues' validation split)" in card
    )
    # the validation pairs are the val file's alone (it replaces the dialogues' split): not "in all"
    assert "(900 training pairs, dialogues included; 100 validation pairs (the val file's))" in card
    extra = {**data, "val_file": None}
    card = model_card({"encoder": ENCODER, "head": {}}, {"data": extra, "train_pairs": 900, "val_pairs": 30})
    assert "(900 training pairs, dialogues included; 30 validation pairs (the dialogues'))" in card
    files = model_card({"encoder": ENCODER, "head": {}}, {"data": {"train_file": "a.csv"}})
    assert "Pair files: train_file `a.csv`." in files and "Chit-Chat" not in files


def test_a_test_file_beside_dialogues_is_named_as_the_test_split():
    """``--dialogues X --test_file Y`` (no train file): Y is the test split (``build_pairs``), but the card named
    only the dialogues."""
    data = {"dialogues": "chitchat", "n_dialogues": [240, 30, 0], "max_context_turns": 3, "test_file": "mine.csv"}
    card = model_card({"encoder": ENCODER, "head": {}}, {"data": data, "train_pairs": 900, "val_pairs": 100})
    assert "Pair files: test_file `mine.csv` (replacing the dialogues' test split) (900 training pairs; 100" in card
