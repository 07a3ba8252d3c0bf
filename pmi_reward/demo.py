"""The main job on the embedded default: train a MiniLM scorer on Chit-Chat, then show what it rewards."""

from __future__ import annotations

from .cli.train import main as train_main
from .scorer import PMIScorer

OUT = "outputs/demo/scorer"
CONTEXT = ("I just got back from a hiking trip in the mountains.\nOh nice, where did you go?\n"
           "We went to Yosemite, the views were amazing.")
CANDIDATES = [
    "Did you see Half Dome? I heard the trail up there is brutal but worth it.",
    "Wow, how long did you hike for? Did you camp overnight?",
    "That's interesting.",
    "ok",
    "We went to Yosemite, the views were amazing.",
    "I like pizza with pineapple.",
]


def main() -> None:
    train_main(["--config", "configs/scorer/minilm.yaml", "--dialogues", "chitchat", "--max_dialogues", "600",
                "--output_dir", OUT])
    scorer = PMIScorer.from_pretrained(OUT)
    print("\ncontext:\n  " + CONTEXT.replace("\n", "\n  ") + "\n\n  PMI  reply")
    for text, value in sorted(zip(CANDIDATES, scorer.score([CONTEXT] * len(CANDIDATES), CANDIDATES)),
                              key=lambda x: -x[1]):
        print(f"{value:+5.2f}  {text}")


if __name__ == "__main__":
    main()
