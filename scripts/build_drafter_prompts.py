"""Build ``src/specrank/data/drafter_prompts.jsonl``: training-only prompts for self-distilling a drafter head.

The bundled evaluation set has 56 prompts in 7 tasks; a head trained on its continuations alone
overfits them. This script composes a larger set of the same 7 tasks from templates and
fill-in lists (topics, numbers, synthetic documents), deterministically under ``--seed``, and
drops any prompt that repeats a bundled one. Categories are interleaved, so any prefix of the
file is balanced across tasks.

    python scripts/build_drafter_prompts.py            # rewrites the bundled file
    python scripts/build_drafter_prompts.py --per-task 100 --out my_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "specrank" / "data" / "drafter_prompts.jsonl"
BUNDLED = ROOT / "src" / "specrank" / "data" / "prompts.jsonl"

TOPICS = [
    "the ocean", "a rainy afternoon", "an old bookstore", "learning to cook", "a city at night", "a lost cat",
    "the first day of school", "a mountain hike", "friendship", "a busy train station", "autumn leaves",
    "a village market", "a lighthouse keeper", "the desert at dawn", "a grandmother's garden", "a robot who paints",
    "moving to a new country", "a thunderstorm", "the last day of summer", "a small bakery", "a chess tournament",
    "a river journey", "space exploration", "a forgotten letter", "a football match", "a quiet library",
    "a winter festival", "a dog learning tricks", "an island holiday", "a jazz concert", "a science fair",
    "the northern lights", "a coffee shop", "a long road trip", "a broken umbrella", "a school play",
    "a family dinner", "a bicycle ride", "the sound of rain", "a museum visit", "a new neighbour",
]
FORMS = [
    "a short poem", "a four-line rhyming poem", "a short story of about 150 words", "a diary entry",
    "a limerick", "an opening paragraph for a novel", "a short speech", "a song chorus",
]
MESSAGES = [
    ("an email to my manager", "asking for a day off next Friday"),
    ("a message to a friend", "congratulating them on their new job"),
    ("a note to my neighbour", "apologising for the noise from last night's party"),
    ("an email to a hotel", "asking whether they have a room with a sea view for two nights in June"),
    ("a thank-you card", "for a teacher who is retiring after thirty years"),
    ("a cover letter paragraph", "for a junior graphic designer position"),
    ("an email to a customer", "explaining that their order will arrive three days late"),
    ("a short invitation", "to a book club meeting on Sunday evening"),
    ("a message to my team", "announcing that the office will close early before the holiday"),
    ("a complaint letter", "about a train that was cancelled without notice"),
    ("a reminder email", "about the deadline for submitting expense reports"),
    ("a welcome message", "for new members of a hiking club"),
    ("a short toast", "for my sister's wedding"),
    ("a polite reply", "declining an invitation to a conference"),
    ("a text message", "asking a colleague to swap shifts on Monday"),
]
PRODUCTS = [
    "a solar-powered phone charger", "noise-cancelling headphones", "a foldable electric bike", "a smart plant pot",
    "a travel backpack with a laptop sleeve", "a cast-iron frying pan", "a wooden puzzle for children",
    "a waterproof hiking jacket", "an electric kettle with temperature control", "a reading lamp with a timer",
]
ADVICE = [
    "stay focused while working from home", "start running as a beginner", "save money on groceries",
    "prepare for a job interview", "learn a new language faster", "sleep better", "keep a houseplant alive",
    "organise a small kitchen", "make a long flight more comfortable", "reduce stress before exams",
    "be more productive in the morning", "plan a birthday party on a budget", "take better photos with a phone",
    "start a vegetable garden", "keep a journal", "make friends at a new school",
]
QA = [
    "How do airplanes stay in the air?", "What is the water cycle?", "Why do leaves change colour in autumn?",
    "How does a refrigerator keep food cold?", "What is inflation in economics?", "Why do we have time zones?",
    "How do bees make honey?", "What is the difference between a planet and a star?", "How does the internet work?",
    "Why is exercise good for the heart?", "What causes earthquakes?", "How do rainbows form?",
    "What is the greenhouse effect?", "Why do cats purr?", "How does a compass work?",
    "What is the difference between a lake and a pond?", "Why does ice float on water?", "How do plants drink water?",
    "What is a black hole?", "How are mountains formed?", "What does DNA do in a cell?",
    "Why do we need to drink water?", "How does a battery store energy?", "What is the speed of light?",
    "Why do some animals hibernate?", "How do tides work?", "What is a democracy?", "How does a microwave oven heat food?",
    "What is the difference between an alligator and a crocodile?", "Why is the ocean salty?",
    "Who invented the telephone?", "What is the tallest mountain in the world?", "How many bones are in the human body?",
    "What is the capital of Australia, and why is it not Sydney?", "Who painted the Mona Lisa?",
    "What were the main causes of the First World War?", "What is machine learning?", "How do solar panels work?",
    "What is the difference between a virus and a computer virus?", "Why do we dream?", "How do vaccines get tested?",
    "What is a healthy breakfast?", "Why is recycling important?", "How does a bicycle stay upright?",
    "What is the role of the kidneys?", "How do birds know where to migrate?", "What is gravity?",
    "Why do onions make people cry?", "What is the difference between a simile and a metaphor?",
    "How does a credit card work?", "Why do stars twinkle?", "What is an ecosystem?", "How do volcanoes erupt?",
    "What is the function of the heart?", "Why is the Amazon rainforest important?", "What is compound interest?",
]
QA_FORMS = ["{q}", "{q} Explain it simply.", "{q} Answer in a few sentences.", "Explain to a ten-year-old: {q}"]
CONCEPTS = [
    "photosynthesis", "supply and demand", "the theory of evolution", "a budget", "electricity", "the immune system",
    "climate change", "a recipe's ingredients list", "the scientific method", "friction", "the stock market",
    "renewable energy", "a noun and a verb", "the solar system", "cloud computing", "a healthy diet",
]
COMPARE = [
    ("a hurricane", "a tornado"), ("a fruit", "a vegetable"), ("speed", "velocity"), ("a loan", "a grant"),
    ("a cold", "the flu"), ("an atom", "a molecule"), ("rent", "a mortgage"), ("a poem", "a song"),
    ("a crocodile", "a lizard"), ("a comet", "an asteroid"), ("a village", "a town"), ("coffee", "tea"),
]
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
EN_SENTENCES = [
    "The library opens at nine o'clock and closes at six.", "My brother is studying medicine in Madrid.",
    "Please turn off the lights when you leave the room.", "We are going to the beach this weekend if it is sunny.",
    "How much does a ticket to the city centre cost?", "I forgot my umbrella at the restaurant yesterday.",
    "The children are playing football in the garden.", "Could you recommend a good restaurant nearby?",
    "Our flight was delayed by two hours because of the fog.", "She has lived in this village for twenty years.",
    "I would like a cup of tea with milk, please.", "The concert starts at eight, so we should leave soon.",
    "He bought fresh bread and cheese at the market.", "It is important to drink enough water every day.",
    "The new bridge will be finished next year.", "Can you help me carry these boxes upstairs?",
    "We visited the old castle on the hill.", "My phone battery is almost empty.",
    "The teacher explained the exercise twice.", "They are planning a trip to the mountains in July.",
]
FOREIGN = [
    ("Spanish", "Me gustaría reservar una mesa para cuatro personas esta noche."),
    ("Spanish", "El museo está cerrado los lunes, pero abre temprano los sábados."),
    ("French", "Nous avons visité le marché et acheté des fruits frais."),
    ("French", "Le train part à huit heures, ne sois pas en retard."),
    ("German", "Ich habe gestern ein sehr interessantes Buch über Geschichte gelesen."),
    ("German", "Kannst du mir bitte sagen, wo der Bahnhof ist?"),
    ("Italian", "Domani andiamo al mare con i nostri amici."),
    ("Italian", "Il ristorante vicino alla piazza è molto famoso."),
    ("Portuguese", "Eu gosto de ler livros antes de dormir."),
    ("Dutch", "Het regent al de hele dag in Amsterdam."),
    ("Spanish", "Mis padres viven en una casa pequeña cerca del río."),
    ("French", "Il fait très froid ce matin, prends ton manteau."),
]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Greg", "Hana", "Ivan", "Jun", "Kira", "Leo", "Maya", "Noor"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Denver", "Nairobi", "Lyon", "Perth", "Quebec", "Tartu", "Valencia"]
PLACES = [
    ("community swimming pool", "swimmers"), ("public library", "readers"), ("science museum", "visitors"),
    ("city zoo", "visitors"), ("youth orchestra", "musicians"), ("farmers' market", "stalls"),
    ("recycling centre", "tonnes of waste"), ("cycling club", "members"), ("language school", "students"),
]
FUNCTIONS = [
    ("reverse_words(sentence)", "returns the sentence with the order of its words reversed"),
    ("count_vowels(text)", "returns the number of vowels in a string"),
    ("is_prime(n)", "returns True if n is a prime number"),
    ("celsius_to_fahrenheit(c)", "converts a temperature from Celsius to Fahrenheit"),
    ("max_of_list(numbers)", "returns the largest number in a list without using max()"),
    ("merge_sorted(a, b)", "merges two sorted lists into one sorted list"),
    ("factorial(n)", "computes n factorial recursively"),
    ("char_frequency(text)", "returns a dictionary counting how often each character appears"),
    ("is_anagram(a, b)", "checks whether two words are anagrams"),
    ("average(numbers)", "returns the mean of a list of numbers, or None for an empty list"),
    ("capitalize_words(text)", "capitalizes the first letter of every word"),
    ("sum_digits(n)", "returns the sum of the digits of a positive integer"),
    ("remove_spaces(text)", "removes all spaces from a string"),
    ("chunk(items, size)", "splits a list into chunks of the given size"),
    ("gcd(a, b)", "returns the greatest common divisor of two integers"),
    ("is_leap_year(year)", "returns True if the year is a leap year"),
    ("fizzbuzz(n)", "returns the FizzBuzz sequence from 1 to n as a list of strings"),
    ("longest_word(sentence)", "returns the longest word in a sentence"),
    ("transpose(matrix)", "returns the transpose of a matrix given as a list of lists"),
    ("running_total(numbers)", "returns the list of cumulative sums"),
    ("unique_sorted(items)", "returns the sorted list of distinct items"),
    ("count_words(path)", "reads a text file and returns the number of words in it"),
    ("to_binary(n)", "returns the binary representation of a non-negative integer as a string"),
    ("validate_email(address)", "checks with a regular expression whether a string looks like an email address"),
]
CODE_FORMS = [
    "Write a Python function `{f}` that {d}.", "Implement `{f}` in Python: it {d}. Include a short docstring.",
    "Write a Python function `{f}` that {d}, and give an example of calling it.",
    "Write a JavaScript function that {d}.", "Explain how you would write a function that {d}, then write it in Python.",
]
SQL = [
    "Write a SQL query that returns the ten most expensive products from a table products(name, price).",
    "Write a SQL query that counts the number of employees in each department from a table employees(name, department).",
    "Write a SQL query that finds all students older than 18 from a table students(name, age).",
    "Write a SQL query that returns the average salary per city from a table staff(name, city, salary).",
    "Write a SQL query that lists the titles of books published after 2010 from a table books(title, year).",
]


def writing(rng):
    kind = rng.random()
    if kind < 0.35:
        return f"Write {rng.choice(FORMS)} about {rng.choice(TOPICS)}."
    if kind < 0.65:
        what, why = rng.choice(MESSAGES)
        return f"Write {what} {why}."
    if kind < 0.8:
        return f"Write a product description for {rng.choice(PRODUCTS)}."
    return f"Give me some practical tips to {rng.choice(ADVICE)}."


def translation(rng):
    if rng.random() < 0.7:
        return f'Translate into {rng.choice(LANGS)}: "{rng.choice(EN_SENTENCES)}"'
    lang, text = rng.choice(FOREIGN)
    return f'Translate the following {lang} sentence into English: "{text}"'


def report(rng):
    """A short synthetic document with concrete facts (a news item, an event notice or a study)."""
    return rng.choice([news, notice, study])(rng)


def notice(rng):
    city, who = rng.choice(CITIES), rng.choice(NAMES)
    event = rng.choice(["spring fair", "charity run", "book festival", "street food week", "open-air cinema night"])
    day, hour, price = rng.choice(["Saturday", "Sunday", "Friday"]), rng.randint(9, 18), rng.randint(0, 25)
    fee = "Entry is free." if price == 0 else f"Tickets cost {price} euros, and children under twelve enter free."
    return (
        f"The {event} returns to the old harbour of {city} this {day}, from {hour}:00 until late evening. "
        f"{fee} Organiser {who} expects around {rng.randint(2, 30) * 100} guests and asks visitors to come by bus or "
        f"bicycle because parking near the harbour is limited. In case of heavy rain, the event moves to the "
        f"{rng.choice(['town hall', 'sports centre', 'covered market'])}."
    )


def study(rng):
    group, n, weeks = rng.choice(["office workers", "students", "older adults", "nurses"]), rng.randint(40, 900), rng.randint(4, 20)
    habit = rng.choice(["a ten-minute walk after lunch", "reading before bed", "drinking more water", "a short daily stretch"])
    return (
        f"A study of {n} {group} tested whether {habit} changes how people feel at work. For {weeks} weeks, half "
        f"of the group followed the routine and half did not. Those who followed it reported {rng.randint(5, 30)} "
        f"percent less tiredness and slightly better mood, but their sleep did not change. The researchers say a "
        f"larger study is needed because the participants reported their own results."
    )


def news(rng):
    city, (place, unit) = rng.choice(CITIES), rng.choice(PLACES)
    year, n, cost = rng.randint(1990, 2023), rng.randint(2, 90) * 10, rng.randint(2, 40)
    who = rng.choice(NAMES)
    return (
        f"The {place} in {city} opened in {year} and now serves about {n} {unit} every week. "
        f"Last month the city approved a renovation costing {cost} million euros, which will add a new entrance, "
        f"longer opening hours and better access for people with disabilities. {who}, who has managed the {place} "
        f"for {rng.randint(3, 15)} years, said the work would start in {rng.choice(['March', 'May', 'September'])} "
        f"and that the {place} would stay partly open during construction. Some residents worried about noise, "
        f"but most welcomed the plan."
    )


def summarization(rng):
    ask = rng.choice([
        "Summarize the following text in two sentences.", "Summarize this news story in one sentence.",
        "Give a brief summary of the following paragraph.", "Summarize the following text in three bullet points.",
    ])
    return f"{ask}\n\n{report(rng)}"


def rag(rng):
    doc = report(rng)
    question = rng.choice([
        "When does it happen?", "How much does it cost?", "Who is named in the text?", "What is the main finding or change?",
        "How many people are involved?", "What happens if plans change?", "What did people worry about?",
    ])
    lead = rng.choice([
        "Answer the question using only the information in the document.\n\nDocument:",
        "Use the passage below to answer the question.\n\nPassage:", "Read the context and answer the question.\n\nContext:",
    ])
    return f"{lead} {doc}\n\nQuestion: {question}"


def qa(rng):
    kind = rng.random()
    if kind < 0.6:
        return rng.choice(QA_FORMS).format(q=rng.choice(QA))
    if kind < 0.8:
        return f"Explain {rng.choice(CONCEPTS)} in simple terms."
    a, b = rng.choice(COMPARE)
    return f"What is the difference between {a} and {b}?"


def math_reasoning(rng):
    a, b, c = rng.randint(2, 12), rng.randint(3, 30), rng.randint(2, 9)
    name, other = rng.sample(NAMES, 2)
    problem = rng.choice([
        f"{name} has {b} apples and gives {c} to each of {a - 1 if a > 2 else 2} friends. How many apples are left?",
        f"A car travels {b * 10} kilometres in {c} hours. What is its average speed?",
        f"A box holds {a} pencils. How many boxes are needed for {a * b + c} pencils?",
        f"{name} reads {b} pages a day. How many days does it take to finish a book of {b * a + c} pages?",
        f"A shirt costs {b * 2} dollars and is on sale for {c * 5} percent off. What is the sale price?",
        f"{name} is {a} years older than {other}. Together they are {2 * b + a} years old. How old is each?",
        f"A garden is {a + 2} metres long and {c + 1} metres wide. What is its area and its perimeter?",
        f"If {a} workers build a wall in {b} hours, how long would {a * 2} workers take at the same rate?",
        f"A bus leaves at 8:{10 + c:02d} and the trip takes {b + 20} minutes. When does it arrive?",
        f"The average of three numbers is {b}. Two of them are {b - c} and {b + a}. What is the third?",
    ])
    return f"{problem} {rng.choice(['Explain your reasoning step by step.', 'Think step by step.', 'Show your work.', ''])}".strip()


def code(rng):
    if rng.random() < 0.15:
        return rng.choice(SQL)
    f, d = rng.choice(FUNCTIONS)
    return rng.choice(CODE_FORMS).format(f=f, d=d)


TASKS = {
    "writing": writing, "translation": translation, "summarization": summarization, "qa": qa,
    "math_reasoning": math_reasoning, "rag": rag, "code": code,
}


def build(per_task: int, seed: int) -> list[dict]:
    """``per_task`` distinct prompts of each task, interleaved, none equal to a bundled prompt."""
    rng = random.Random(seed)
    bundled = {json.loads(line)["turns"][0] for line in BUNDLED.read_text(encoding="utf-8").splitlines() if line.strip()}
    by_task = {}
    for task, make in TASKS.items():
        seen, tries = [], 0
        while len(seen) < per_task and tries < per_task * 50:
            tries += 1
            text = make(rng)
            if text not in bundled and text not in seen:
                seen.append(text)
        by_task[task] = seen
    rows = []
    for i in range(per_task):
        for task, texts in by_task.items():
            if i < len(texts):
                rows.append({"question_id": f"bank-{task}-{i:04d}", "category": task, "turns": [texts[i]]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-task", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = build(args.per_task, args.seed)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} prompts written to {args.out}")


if __name__ == "__main__":
    main()
