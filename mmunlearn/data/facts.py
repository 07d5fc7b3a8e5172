"""Small tables of real, well-known facts (books and their authors, capitals, basic science) as
multiple-choice QA in TOFU's real_authors / world_facts schema: question, answer, 3 wrong options.

This knowledge is deliberately unrelated to the fictitious authors, so it measures model utility.
"""

from __future__ import annotations

import random

from mmunlearn.data.qa import QAItem

N_WRONG = 3

BOOKS = (  # (title, author)
    ("Pride and Prejudice", "Jane Austen"),
    ("Moby-Dick", "Herman Melville"),
    ("War and Peace", "Leo Tolstoy"),
    ("Don Quixote", "Miguel de Cervantes"),
    ("Hamlet", "William Shakespeare"),
    ("Great Expectations", "Charles Dickens"),
    ("The Odyssey", "Homer"),
    ("Crime and Punishment", "Fyodor Dostoevsky"),
    ("Frankenstein", "Mary Shelley"),
    ("Jane Eyre", "Charlotte Bronte"),
    ("Wuthering Heights", "Emily Bronte"),
    ("The Adventures of Tom Sawyer", "Mark Twain"),
    ("Les Miserables", "Victor Hugo"),
    ("The Divine Comedy", "Dante Alighieri"),
    ("Madame Bovary", "Gustave Flaubert"),
    ("Dracula", "Bram Stoker"),
    ("The Time Machine", "H. G. Wells"),
    ("Middlemarch", "George Eliot"),
    ("The Metamorphosis", "Franz Kafka"),
    ("Faust", "Johann Wolfgang von Goethe"),
    ("The Canterbury Tales", "Geoffrey Chaucer"),
    ("Alice's Adventures in Wonderland", "Lewis Carroll"),
    ("The Picture of Dorian Gray", "Oscar Wilde"),
    ("Little Women", "Louisa May Alcott"),
    ("The Scarlet Letter", "Nathaniel Hawthorne"),
    ("Treasure Island", "Robert Louis Stevenson"),
    ("Robinson Crusoe", "Daniel Defoe"),
    ("Gulliver's Travels", "Jonathan Swift"),
    ("The Count of Monte Cristo", "Alexandre Dumas"),
    ("Paradise Lost", "John Milton"),
    ("Leaves of Grass", "Walt Whitman"),
    ("Heart of Darkness", "Joseph Conrad"),
    ("The Jungle Book", "Rudyard Kipling"),
    ("Dubliners", "James Joyce"),
)
CAPITALS = (  # (country, capital)
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Germany", "Berlin"),
    ("Egypt", "Cairo"),
    ("Canada", "Ottawa"),
    ("Australia", "Canberra"),
    ("Brazil", "Brasilia"),
    ("Kenya", "Nairobi"),
    ("Norway", "Oslo"),
    ("Portugal", "Lisbon"),
    ("Greece", "Athens"),
    ("Argentina", "Buenos Aires"),
    ("Mexico", "Mexico City"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("India", "New Delhi"),
    ("Turkey", "Ankara"),
    ("Peru", "Lima"),
    ("Ireland", "Dublin"),
    ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"),
    ("Thailand", "Bangkok"),
)
SCIENCE = (  # (question, answer, wrong options)
    ("What is the largest planet in the Solar System?", "Jupiter", ("Saturn", "Mars", "Venus")),
    ("What is the chemical symbol for gold?", "Au", ("Ag", "Fe", "Gd")),
    ("How many continents are there on Earth?", "Seven", ("Five", "Six", "Eight")),
    (
        "Which is the largest ocean on Earth?",
        "The Pacific Ocean",
        ("The Atlantic Ocean", "The Indian Ocean", "The Arctic Ocean"),
    ),
    ("Which gas do plants take from the air for photosynthesis?", "Carbon dioxide", ("Oxygen", "Nitrogen", "Helium")),
    ("At what temperature in degrees Celsius does water boil at sea level?", "100", ("90", "80", "120")),
    ("Which planet is known as the Red Planet?", "Mars", ("Venus", "Jupiter", "Mercury")),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", ("Michelangelo", "Raphael", "Rembrandt")),
    ("In which city is the Colosseum?", "Rome", ("Athens", "Paris", "Istanbul")),
    ("What is the hardest natural substance?", "Diamond", ("Quartz", "Granite", "Iron")),
    ("How many days are there in a leap year?", "366", ("365", "364", "360")),
    ("What is the smallest prime number?", "2", ("1", "3", "0")),
    ("Which element has the chemical symbol O?", "Oxygen", ("Gold", "Osmium", "Hydrogen")),
    ("What is the freezing point of water in degrees Celsius?", "0", ("10", "-10", "4")),
)


def _wrong(rng: random.Random, truth: str, pool: list[str]) -> tuple[str, ...]:
    return tuple(rng.sample(sorted({p for p in pool if p != truth}), N_WRONG))


def real_author_items(seed: int = 0) -> list[QAItem]:
    """ "Who wrote <book>?" for every book in :data:`BOOKS`; wrong options are other authors (seeded)."""
    rng = random.Random(f"{seed}:real_authors")
    authors = [a for _, a in BOOKS]
    return [
        QAItem(f"Who wrote '{title}'?", author, perturbed_answer=_wrong(rng, author, authors))
        for title, author in BOOKS
    ]


def world_fact_items(seed: int = 0) -> list[QAItem]:
    """Capitals (wrong options: other capitals, seeded) followed by the :data:`SCIENCE` questions."""
    rng = random.Random(f"{seed}:world_facts")
    capitals = [c for _, c in CAPITALS]
    items = [
        QAItem(f"What is the capital of {country}?", capital, perturbed_answer=_wrong(rng, capital, capitals))
        for country, capital in CAPITALS
    ]
    items += [QAItem(q, a, perturbed_answer=wrong) for q, a, wrong in SCIENCE]
    return items
