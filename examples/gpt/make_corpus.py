"""Write the example corpus: short village stories from a seeded grammar (ASCII, public domain).

    python examples/gpt/make_corpus.py            # rewrites examples/gpt/corpus.txt (same bytes every time)

The text is original and generated here, so nothing is downloaded and no licence applies (CC0). A
grammar gives it real structure at every scale a tiny model can learn: spelling, word order,
punctuation, names that recur through a story, and dialogue.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "corpus.txt"

NAMES = ["Anna", "Ben", "Clara", "David", "Ella", "Finn", "Grace", "Henry", "Iris", "Jack", "Lena", "Max",
         "Nora", "Oscar", "Rosa", "Sam", "Tom", "Vera", "Will", "Zoe"]
ELDERS = ["the old baker", "the miller", "the shepherd", "the teacher", "the fisherman", "the weaver",
          "the blacksmith", "the farmer's wife", "the keeper of the lighthouse", "the doctor"]
ANIMALS = ["cat", "dog", "goat", "fox", "owl", "rabbit", "horse", "duck", "mouse", "crow", "pig", "sheep"]
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "brown", "grey", "golden", "silver"]
SIZES = ["small", "big", "little", "tall", "round", "long", "heavy", "tiny"]
THINGS = ["ball", "kite", "basket", "lantern", "book", "hat", "boat", "box", "key", "cup", "bell", "coat",
          "map", "drum", "shoe", "ribbon"]
PLACES = ["the garden", "the forest", "the river", "the market", "the hill", "the barn", "the bridge",
          "the school", "the beach", "the meadow", "the mill", "the harbour", "the orchard", "the square"]
TIMES = ["One morning", "One evening", "Early in the day", "After lunch", "On a cold night",
         "At sunrise", "Late in the afternoon", "On the first day of spring", "One rainy Sunday",
         "When the snow came"]
WEATHER = ["the sun was warm", "the wind was strong", "it was raining softly", "the sky was clear",
           "fog lay over the fields", "snow covered the roofs", "the air smelled of bread",
           "clouds moved over the hills"]
FEELINGS = ["happy", "sad", "tired", "hungry", "curious", "afraid", "proud", "cold", "excited", "calm"]
MOVES = ["walked", "ran", "hurried", "wandered", "climbed", "rode", "skipped", "went"]
FINDS = ["found", "saw", "picked up", "noticed", "dropped", "lost", "carried", "painted"]
SAYS = ["said", "asked", "called", "whispered", "shouted", "laughed"]
FOODS = ["bread", "apples", "soup", "cheese", "honey", "cake", "pears", "milk", "plums", "nuts"]
MORALS = [
    "A friend in need is a friend indeed.",
    "Slow and steady wins the race.",
    "Many hands make light work.",
    "Look before you leap.",
    "It is better to give than to take.",
    "Every cloud has a silver lining.",
    "Kind words cost nothing.",
    "Small steps make a long road.",
]
QUESTIONS = ["Where are you going?", "What is in the {thing}?", "Can I help you?", "Have you seen my {animal}?",
             "Why are you {feeling}?", "Is it far to {place}?", "Do you want some {food}?"]
ANSWERS = ["I am going to {place}.", "Only some {food}.", "Yes, please.", "It ran to {place}.",
           "Because the {thing} is lost.", "Not far, just past {place}.", "No, thank you, I am not hungry."]


class StoryWriter:
    """Builds stories sentence by sentence; ``rng`` alone decides every choice."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, options: list[str]) -> str:
        return self.rng.choice(options)

    def fill(self, template: str, **fixed: str) -> str:
        """``template`` with every ``{slot}`` filled (``fixed`` slots kept, others drawn)."""
        slots = {"thing": self.pick(THINGS), "animal": self.pick(ANIMALS), "feeling": self.pick(FEELINGS),
                 "place": self.pick(PLACES), "food": self.pick(FOODS)}
        slots.update(fixed)
        return template.format(**slots)

    def thing(self) -> str:
        return f"{self.pick(['a', 'the'])} {self.pick(SIZES)} {self.pick(COLOURS)} {self.pick(THINGS)}"

    def opening(self, hero: str, friend: str) -> list[str]:
        return [
            f"{self.pick(TIMES)}, {self.pick(WEATHER)}.",
            f"{hero} {self.pick(MOVES)} to {self.pick(PLACES)} with {friend}.",
        ]

    def middle(self, hero: str, friend: str, pet: str) -> str:
        """One sentence of the story's middle, in one of several shapes."""
        shape = self.rng.randrange(8)
        if shape == 0:
            return f"There {hero} {self.pick(FINDS)} {self.thing()}."
        if shape == 1:
            return f"{friend} felt {self.pick(FEELINGS)}, so {hero} shared some {self.pick(FOODS)}."
        if shape == 2:
            return f"The {pet} followed them all the way to {self.pick(PLACES)}."
        if shape == 3:
            question = self.fill(self.pick(QUESTIONS), animal=pet)
            answer = self.fill(self.pick(ANSWERS))
            return f"\"{question}\" {self.pick(SAYS)} {friend}. \"{answer}\" {self.pick(SAYS)} {hero}."
        if shape == 4:
            elder = self.pick(ELDERS)
            return f"On the way they met {elder}, who gave them {self.pick(FOODS)} and {self.thing()}."
        if shape == 5:
            return f"{hero} was {self.pick(FEELINGS)} because {self.pick(WEATHER)}."
        if shape == 6:
            count, colour, thing = self.rng.randint(2, 12), self.pick(COLOURS), self.pick(THINGS)
            return f"They counted {count} {colour} {thing}s by {self.pick(PLACES)}."
        return f"The {pet} {self.pick(MOVES)} after {self.thing()} and {hero} laughed."

    def ending(self, hero: str, friend: str) -> list[str]:
        first, second = self.rng.sample(FEELINGS, 2)
        lines = [f"In the end {hero} and {friend} went home {first} and {second}."]
        if self.rng.random() < 0.4:
            lines.append(self.pick(MORALS))
        return lines

    def story(self) -> str:
        hero, friend = self.rng.sample(NAMES, 2)
        pet = self.pick(ANIMALS)
        lines = [*self.opening(hero, friend), f"{hero} had a {self.pick(COLOURS)} {pet}."]
        lines += [self.middle(hero, friend, pet) for _ in range(self.rng.randint(3, 7))]
        lines += self.ending(hero, friend)
        return " ".join(lines)


def write_corpus(nbytes: int, seed: int) -> str:
    """Stories separated by blank lines until the text reaches ``nbytes`` bytes."""
    writer = StoryWriter(random.Random(seed))
    parts: list[str] = []
    size = 0
    while size < nbytes:
        parts.append(writer.story())
        size += len(parts[-1]) + 2
    return "\n\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=160_000, help="approximate size of the corpus")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    text = write_corpus(args.bytes, args.seed)
    args.out.write_text(text, encoding="ascii")
    print(f"wrote {len(text):,} bytes, {text.count(chr(10) * 2) + 1} stories to {args.out}")


if __name__ == "__main__":
    main()
