"""Training prompts: the workloads' train split and many templated questions, never a benchmark prompt.

A learned drafter must see far more text than the ~215 train-split prompts of
the three workloads give (a pilot on 436 responses overfit: held-out step-0
accuracy 0.38 against 0.70 on its training data). The target writes the
answers itself (data.py, corpus.py); here we only need *questions*, in the same three
styles the benchmarks ask, but never the benchmark questions themselves:

``gen-code``  HumanEval-style stubs (the same instruction and code fence as
              the humaneval workload) and "write a function that ..." requests,
              built from a list of small programming tasks written for this file;
``gen-math``  grade-school word problems from templates with random numbers;
``gen-chat``  explain / advise / write / compare / list requests, templates
              filled from topic lists.

Everything is drawn from a seeded random generator, so the same call gives the
same prompts on every machine. `training_prompts` mixes these with the
train split and drops anything that belongs to the bench split.

Held-out prompts stay held out, and the rule lives here, beside the prompts:
a prompt is refused when its id is in the benchmark split
(`workloads.is_benchmark_prompt`) or its text is a benchmark prompt's text
(`bench_texts`), even under another id. `check_no_benchmark_prompts` guards
every writer of answers (data.build_dataset, the corpus job);
`check_no_benchmark_prompts_by_id` guards data already on disk, whose
examples carry only the id of their prompt (features.training_data).
"""

from __future__ import annotations

import random

from ..workloads import HUMANEVAL_INSTRUCTION, WORKLOADS, Prompt, is_benchmark_prompt, load_workload

# --- code --------------------------------------------------------------------
# (function name, signature, what it does, one doctest "call -> result")
CODE_TASKS = [
    ("count_vowels", "s: str) -> int", "Return the number of vowels in the string s.", "count_vowels('hello') -> 2"),
    ("reverse_words", "sentence: str) -> str", "Return the sentence with the order of its words reversed.",
     "reverse_words('a b c') -> 'c b a'"),
    ("is_palindrome", "text: str) -> bool", "Return True if text reads the same forwards and backwards.",
     "is_palindrome('level') -> True"),
    ("second_largest", "numbers: list) -> int", "Return the second largest distinct number in the list.",
     "second_largest([4, 1, 7, 7, 3]) -> 4"),
    ("running_sum", "numbers: list) -> list", "Return the list of running totals of numbers.",
     "running_sum([1, 2, 3]) -> [1, 3, 6]"),
    ("flatten", "nested: list) -> list", "Flatten a list of lists into one list.", "flatten([[1, 2], [3]]) -> [1, 2, 3]"),
    ("char_frequency", "s: str) -> dict", "Return a dictionary that maps each character of s to its count.",
     "char_frequency('aab') -> {'a': 2, 'b': 1}"),
    ("remove_duplicates", "items: list) -> list", "Remove duplicates from items, keeping the first occurrence order.",
     "remove_duplicates([3, 1, 3, 2, 1]) -> [3, 1, 2]"),
    ("gcd", "a: int, b: int) -> int", "Return the greatest common divisor of a and b.", "gcd(12, 18) -> 6"),
    ("lcm", "a: int, b: int) -> int", "Return the least common multiple of a and b.", "lcm(4, 6) -> 12"),
    ("is_prime", "n: int) -> bool", "Return True if n is a prime number.", "is_prime(7) -> True"),
    ("primes_below", "n: int) -> list", "Return all prime numbers smaller than n.", "primes_below(10) -> [2, 3, 5, 7]"),
    ("fibonacci", "n: int) -> int", "Return the n-th Fibonacci number, with fibonacci(0) = 0.", "fibonacci(7) -> 13"),
    ("factorial", "n: int) -> int", "Return n factorial.", "factorial(5) -> 120"),
    ("digit_sum", "n: int) -> int", "Return the sum of the decimal digits of a non-negative integer n.",
     "digit_sum(1234) -> 10"),
    ("capitalize_words", "text: str) -> str", "Capitalize the first letter of every word in text.",
     "capitalize_words('hello world') -> 'Hello World'"),
    ("count_words", "text: str) -> int", "Return the number of words in text.", "count_words('a quick fox') -> 3"),
    ("longest_word", "sentence: str) -> str", "Return the longest word in the sentence (the first one on a tie).",
     "longest_word('I love programming') -> 'programming'"),
    ("merge_sorted", "a: list, b: list) -> list", "Merge two sorted lists into one sorted list.",
     "merge_sorted([1, 4], [2, 3]) -> [1, 2, 3, 4]"),
    ("binary_search", "items: list, target: int) -> int",
     "Return the index of target in the sorted list items, or -1 if it is missing.", "binary_search([1, 3, 5], 5) -> 2"),
    ("chunk", "items: list, size: int) -> list", "Split items into consecutive chunks of length size.",
     "chunk([1, 2, 3, 4, 5], 2) -> [[1, 2], [3, 4], [5]]"),
    ("rotate_list", "items: list, k: int) -> list", "Rotate items to the right by k positions.",
     "rotate_list([1, 2, 3, 4], 1) -> [4, 1, 2, 3]"),
    ("is_anagram", "a: str, b: str) -> bool", "Return True if a and b contain the same letters in any order.",
     "is_anagram('listen', 'silent') -> True"),
    ("celsius_to_fahrenheit", "c: float) -> float", "Convert a temperature from Celsius to Fahrenheit.",
     "celsius_to_fahrenheit(100) -> 212.0"),
    ("average", "numbers: list) -> float", "Return the mean of numbers, or 0.0 for an empty list.",
     "average([1, 2, 3, 4]) -> 2.5"),
    ("median", "numbers: list) -> float", "Return the median of a non-empty list of numbers.", "median([3, 1, 2]) -> 2"),
    ("count_evens", "numbers: list) -> int", "Return how many numbers in the list are even.", "count_evens([1, 2, 4]) -> 2"),
    ("max_difference", "numbers: list) -> int", "Return the largest value minus the smallest value in numbers.",
     "max_difference([3, 9, 1]) -> 8"),
    ("title_case_names", "names: list) -> list", "Return the names with each one in title case.",
     "title_case_names(['ann', 'BOB']) -> ['Ann', 'Bob']"),
    ("filter_long_words", "words: list, n: int) -> list", "Return the words that are longer than n characters.",
     "filter_long_words(['hi', 'hello'], 3) -> ['hello']"),
    ("sum_of_squares", "n: int) -> int", "Return 1*1 + 2*2 + ... + n*n.", "sum_of_squares(3) -> 14"),
    ("to_binary", "n: int) -> str", "Return the binary representation of a non-negative integer as a string.",
     "to_binary(5) -> '101'"),
    ("from_binary", "bits: str) -> int", "Convert a string of 0s and 1s into the integer it represents.",
     "from_binary('110') -> 6"),
    ("is_leap_year", "year: int) -> bool", "Return True if year is a leap year in the Gregorian calendar.",
     "is_leap_year(2024) -> True"),
    ("caesar_shift", "text: str, shift: int) -> str", "Shift each lowercase letter of text by shift places in the alphabet.",
     "caesar_shift('abc', 1) -> 'bcd'"),
    ("most_common", "items: list) -> object", "Return the element that appears most often in items.",
     "most_common([1, 2, 2, 3]) -> 2"),
    ("pairs_with_sum", "numbers: list, total: int) -> list",
     "Return all pairs (a, b) with a before b in the list and a + b == total.", "pairs_with_sum([1, 2, 3], 4) -> [(1, 3)]"),
    ("matrix_transpose", "matrix: list) -> list", "Return the transpose of a matrix given as a list of rows.",
     "matrix_transpose([[1, 2], [3, 4]]) -> [[1, 3], [2, 4]]"),
    ("count_uppercase", "s: str) -> int", "Return the number of uppercase letters in s.", "count_uppercase('HeLLo') -> 3"),
    ("strip_punctuation", "text: str) -> str", "Remove every punctuation character from text.",
     "strip_punctuation('hi, you!') -> 'hi you'"),
    ("nth_largest", "numbers: list, n: int) -> int", "Return the n-th largest number in the list (n = 1 is the largest).",
     "nth_largest([5, 1, 9, 3], 2) -> 5"),
    ("interleave", "a: list, b: list) -> list", "Interleave two lists of equal length.",
     "interleave([1, 3], [2, 4]) -> [1, 2, 3, 4]"),
    ("word_lengths", "sentence: str) -> list", "Return the length of every word in the sentence.",
     "word_lengths('to be or') -> [2, 2, 2]"),
    ("all_unique", "items: list) -> bool", "Return True if no element of items appears twice.", "all_unique([1, 2, 3]) -> True"),
    ("clamp", "x: float, low: float, high: float) -> float", "Limit x to the range from low to high.",
     "clamp(12, 0, 10) -> 10"),
    ("product", "numbers: list) -> int", "Return the product of all numbers in the list (1 for an empty list).",
     "product([2, 3, 4]) -> 24"),
    ("vowel_positions", "word: str) -> list", "Return the indices of the vowels in word.", "vowel_positions('apple') -> [0, 4]"),
    ("dict_invert", "d: dict) -> dict", "Swap the keys and values of a dictionary.", "dict_invert({'a': 1}) -> {1: 'a'}"),
    ("split_even_odd", "numbers: list) -> tuple", "Return a tuple (evens, odds) of the numbers.",
     "split_even_odd([1, 2, 3]) -> ([2], [1, 3])"),
    ("sum_digits_string", "s: str) -> int", "Return the sum of all digit characters in the string s.",
     "sum_digits_string('a1b2') -> 3"),
    ("repeat_string", "s: str, n: int, sep: str) -> str", "Repeat s n times, joined by sep.",
     "repeat_string('ab', 3, '-') -> 'ab-ab-ab'"),
    ("triangle_area", "base: float, height: float) -> float", "Return the area of a triangle.",
     "triangle_area(4, 3) -> 6.0"),
    ("count_substring", "text: str, sub: str) -> int", "Count how many times sub occurs in text, overlaps included.",
     "count_substring('aaa', 'aa') -> 2"),
    ("is_sorted", "numbers: list) -> bool", "Return True if the numbers are in non-decreasing order.",
     "is_sorted([1, 2, 2, 5]) -> True"),
    ("snake_to_camel", "name: str) -> str", "Convert a snake_case name to camelCase.",
     "snake_to_camel('my_var_name') -> 'myVarName'"),
    ("mask_email", "email: str) -> str", "Hide all but the first letter of the name part of an email address.",
     "mask_email('anna@mail.com') -> 'a***@mail.com'"),
    ("zip_to_dict", "keys: list, values: list) -> dict", "Build a dictionary from a list of keys and a list of values.",
     "zip_to_dict(['a', 'b'], [1, 2]) -> {'a': 1, 'b': 2}"),
    ("cumulative_max", "numbers: list) -> list", "Return the running maximum of the list.",
     "cumulative_max([1, 3, 2, 5]) -> [1, 3, 3, 5]"),
    ("hamming_distance", "a: str, b: str) -> int", "Return the number of positions where two equal-length strings differ.",
     "hamming_distance('abc', 'abd') -> 1"),
    ("find_missing", "numbers: list) -> int", "The list holds 1..n with one number missing; return that number.",
     "find_missing([1, 2, 4]) -> 3"),
]
CODE_REQUESTS = [
    "Write a Python function `{name}({sig}` that does the following: {desc}",
    "Write a Python function called {name}. {desc} Include a short docstring and an example.",
    "Explain how you would solve this in Python, then give the code: {desc}",
]


def code_prompts(rng: random.Random) -> list[Prompt]:
    """A HumanEval-style stub and three plain requests per task."""
    prompts = []
    for name, sig, desc, example in CODE_TASKS:
        call, result = example.split(" -> ")
        stub = f'def {name}({sig}:\n    """ {desc}\n    >>> {call}\n    {result}\n    """\n'
        text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{stub}```"
        prompts.append(Prompt(f"gen-code/{name}/stub", text, "gen-code"))
        for i, request in enumerate(CODE_REQUESTS):
            prompts.append(Prompt(f"gen-code/{name}/r{i}", request.format(name=name, sig=sig, desc=desc), "gen-code"))
    return prompts


# --- math ---------------------------------------------------------------------
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Felix", "Grace", "Hugo", "Isla", "Jonas", "Kira", "Luca", "Mei",
         "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yara", "Zoe"]
ITEMS = ["apples", "pencils", "stickers", "cookies", "books", "marbles", "cards", "shirts", "cupcakes", "tickets",
         "bottles of juice", "notebooks", "toy cars", "flowers", "eggs"]
MATH_TEMPLATES = [
    "{n1} buys {a} {it} for ${p} each and pays with a ${bill} note. How much change does {n1} get?",
    "{n1} has {a} {it}. {n1} gives {b} to {n2} and then buys {c} more. How many {it} does {n1} have now?",
    "A shop sells {it} in packs of {b}. {n1} needs {a2} {it}. How many packs must {n1} buy?",
    "{n1} reads {a} pages every day. How many pages does {n1} read in {b} weeks?",
    "A car travels {a} km in {b} hours. What is its average speed in km per hour?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "{n1} earns ${a} per hour and works {b} hours a week. How much does {n1} earn in {c} weeks?",
    "A class of {a2} students is split into groups of {b}. How many full groups are there, and how many students are left over?",
    "The price of a bike is ${a}0. It is on sale for {pct}% off. What is the sale price?",
    "{n1} saves ${b} every week. How many weeks does it take to save ${a2}?",
    "A recipe needs {b} eggs for {c} people. How many eggs are needed for {d} people?",
    "A tank holds {a}0 litres of water. It loses {b} litres every hour. How much water is left after {c} hours?",
    "{n1} is {a} years old. {n2} is {b} years older than {n1}. How old will {n2} be in {c} years?",
    "A bus leaves at {h}:{m:02d} and the trip takes {b} hours and {c}0 minutes. At what time does it arrive?",
    "{n1} scored {a}, {b}, {c} and {d} points in four games. What was the average score?",
    "A garden has {a} rows of {b} plants. {c} plants are sold. How many plants are left?",
    "{n1} and {n2} share {a2} {it} in the ratio {b}:{c}. How many {it} does each get?",
    "A train ticket costs ${a} for an adult and ${b} for a child. How much do {c} adults and {d} children pay?",
    "What is {pct}% of {a}0?",
    "A square has a perimeter of {a4} cm. What is its area?",
    "{n1} runs {b} km on Monday, {c} km on Wednesday and {d} km on Friday. How far does {n1} run in {e} such weeks?",
    "A box holds {b} {it}. How many boxes are needed for {a2} {it}?",
]


def math_prompts(rng: random.Random, n: int) -> list[Prompt]:
    """`n` word problems: each template filled with fresh random names and numbers."""
    prompts = []
    for i in range(n):
        template = MATH_TEMPLATES[i % len(MATH_TEMPLATES)]
        n1, n2 = rng.sample(NAMES, 2)
        values = dict(
            n1=n1, n2=n2, it=rng.choice(ITEMS), a=rng.randint(5, 60), b=rng.randint(2, 9), c=rng.randint(2, 9),
            d=rng.randint(2, 12), e=rng.randint(2, 6), p=rng.randint(1, 9), bill=rng.choice([20, 50, 100]),
            a2=rng.randint(20, 200), a4=4 * rng.randint(3, 30), pct=rng.choice([5, 10, 15, 20, 25, 30, 40, 50]),
            h=rng.randint(6, 20), m=rng.choice([0, 5, 15, 20, 30, 45, 50]),
        )
        prompts.append(Prompt(f"gen-math/{i:04d}", template.format(**values), "gen-math"))
    return prompts


# --- chat ---------------------------------------------------------------------
TOPICS = ["how rainbows form", "what gravity is", "how vaccines work", "what inflation is", "how a fridge keeps food cold",
          "why leaves change colour in autumn", "what DNA is", "how airplanes stay in the air", "what a computer virus is",
          "how the moon causes tides", "what electricity is", "how bees make honey", "what an election is",
          "how a camera works", "why the ocean is salty", "what compound interest is", "how recycling works",
          "what a black hole is", "how the heart pumps blood", "what machine learning is", "how a bank loan works",
          "why we need sleep", "how earthquakes happen", "what a calendar year is", "how soap cleans hands",
          "what the stock market is", "how clouds form", "why bread rises", "what an allergy is",
          "how a solar panel works", "what a map scale is", "how the post office delivers letters"]
AUDIENCES = ["in simple words", "to a ten-year-old", "in three sentences", "step by step", "with an everyday example"]
ACTIVITIES = ["learning a new language", "keeping a tidy desk", "cooking on a budget", "running a 5 km race",
              "taking better photos with a phone", "starting a vegetable garden", "saving for a holiday",
              "making friends in a new city", "writing a cover letter", "staying calm before an exam",
              "reading more books", "drinking less coffee", "travelling with a small child", "working from home",
              "learning to play the guitar", "keeping a car in good shape", "planning a picnic", "giving a short speech",
              "organising a closet", "walking a new puppy", "waking up earlier", "making a weekly meal plan"]
WRITING = [("a short email", "my landlord", "a leaking kitchen tap"), ("a short message", "a colleague", "swapping shifts next week"),
           ("a short note", "my child's teacher", "a missed school day"), ("a polite email", "a customer", "a delayed order"),
           ("a friendly text", "my sister", "her new job"), ("a short letter", "the city council", "a broken street light"),
           ("a short invitation", "my neighbours", "a garden party on Sunday"),
           ("a thank-you message", "a coworker", "helping me with a project"),
           ("a short announcement", "a book club", "the next meeting place"),
           ("a short reply", "a friend", "why I cannot come to the concert"),
           ("a short poem", "the autumn wind", "falling leaves"), ("a short story", "a curious cat", "a lost key")]
PAIRS = [("a virus", "a bacterium"), ("a lake", "a sea"), ("renting", "buying a home"), ("a laptop", "a tablet"),
         ("baking", "roasting"), ("a crocodile", "an alligator"), ("weather", "a forecast"), ("email", "a letter"),
         ("a debit card", "a credit card"), ("jogging", "walking"), ("a town", "a city"), ("butter", "margarine"),
         ("a hurricane", "a tornado"), ("a noun", "a verb"), ("trains", "buses for a daily commute"),
         ("summer", "winter holidays"), ("a museum", "a gallery"), ("a pond", "a river")]
LISTS = ["fun activities for a family weekend", "healthy snacks for work", "names for a pet rabbit",
         "questions to ask a new doctor", "ways to reduce plastic at home", "gift ideas for a teacher",
         "things to pack for a beach day", "easy dinners with rice", "hobbies that cost little money",
         "ways to make a small room feel bigger", "board games for four players", "reasons to learn to swim",
         "ideas for a school science project", "quick stretches after sitting all day"]
HOWTO = ["make a cup of tea", "change a flat bicycle tyre", "write a to-do list that works", "plant a tree",
         "clean a laptop keyboard", "make pancakes", "back up the photos on my phone", "tie a tie", "iron a shirt",
         "fold a fitted sheet", "make a simple budget", "remove a coffee stain", "prepare for a job interview",
         "set up a fish tank", "learn to touch type", "cook rice without a rice cooker"]


def chat_prompts(rng: random.Random) -> list[Prompt]:
    """Explain / tips / write / compare / list / how-to requests from the lists above."""
    texts = []
    texts += [f"Explain {topic} {rng.choice(AUDIENCES)}." for topic in TOPICS]
    texts += [f"Explain {topic}." for topic in TOPICS]
    texts += [f"Give me {rng.choice(['three', 'four', 'five', 'some'])} tips for {a}." for a in ACTIVITIES]
    texts += [f"What should I know before {a}?" for a in ACTIVITIES]
    texts += [f"Write {kind} to {who} about {what}." for kind, who, what in WRITING]
    texts += [f"What is the difference between {a} and {b}?" for a, b in PAIRS]
    texts += [f"Compare {a} and {b} in a few sentences." for a, b in PAIRS]
    texts += [f"List {rng.choice(['five', 'six', 'ten'])} {thing}." for thing in LISTS]
    texts += [f"How do I {task}?" for task in HOWTO]
    return [Prompt(f"gen-chat/{i:04d}", text, "gen-chat") for i, text in enumerate(texts)]


def generated_prompts(seed: int = 0, num_math: int = 400) -> list[Prompt]:
    """All templated prompts, code, math and chat interleaved so any prefix is mixed."""
    rng = random.Random(seed)
    groups = [code_prompts(rng), math_prompts(rng, num_math), chat_prompts(rng)]
    mixed = []
    for i in range(max(len(g) for g in groups)):
        mixed += [g[i] for g in groups if i < len(g)]
    return mixed


# --- the training prompts, and the guard that keeps benchmark prompts out ----------------------


def bench_texts() -> set[str]:
    """The text of every benchmark-split prompt (to refuse them even under another id)."""
    return {p.text for name in WORKLOADS for p in load_workload(name, split="bench")}


def training_prompts(generated: bool = True, seed: int = 0, num_math: int = 400) -> list[Prompt]:
    """Train-split prompts of the three workloads and (optionally) templated ones, in a seeded mixed order.

    Never a benchmark prompt: any id in the bench split and any text equal to a
    bench prompt's text is dropped (generated ids are hashed like any other).
    """
    prompts = [p for name in WORKLOADS for p in load_workload(name, split="train")]
    if generated:
        prompts += generated_prompts(seed=seed, num_math=num_math)
    held_out = bench_texts()
    prompts = [p for p in prompts if not is_benchmark_prompt(p.id) and p.text not in held_out]
    random.Random(seed).shuffle(prompts)  # mixed kinds, so any prefix (a stopped run) covers all of them
    return prompts


def check_no_benchmark_prompts(prompts: list[Prompt]) -> None:
    """Refuse prompts from the benchmark split: a drafter must not learn the test."""
    held_out = bench_texts()
    leaked = [p.id for p in prompts if is_benchmark_prompt(p.id) or p.text in held_out]
    if leaked:
        raise ValueError(
            f"{len(leaked)} prompt(s) belong to the benchmark split (e.g. {leaked[0]!r}); "
            "training data must come from training_prompts() or split='train' only."
        )


def check_no_benchmark_prompts_by_id(ids) -> None:
    """The same guard for data already on disk (examples carry the id of their prompt)."""
    leaked = [i for i in ids if is_benchmark_prompt(i)]
    if leaked:
        raise ValueError(f"{len(leaked)} training example(s) come from benchmark prompts (e.g. {leaked[0]!r}): "
                         "delete that dataset and rebuild it from training_prompts().")
