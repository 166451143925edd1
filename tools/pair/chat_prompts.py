"""The questions a chat draft is distilled on, and the held-out ones its demo asks.

Training questions are instruction templates crossed with topics, drawn with a fixed seed, so the
set is reproducible without downloading a dataset. The held-out questions (HELD_OUT, from
models/smollm2-draft/samples.json) are the demo's sample prompts: no training question shares a
topic word with them.
"""

import json
import os
import random

# The demo's questions (tools/run-demo.sh --prompt-index N); never trained on.
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
                       "smollm2-draft", "samples.json")
with open(SAMPLES) as samples_file:
    HELD_OUT = json.load(samples_file)["questions"]

TEMPLATES = [
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Explain {t} to a ten-year-old.",
    "Why is {t} important?",
    "Give me three facts about {t}.",
    "Write a short paragraph about {t}.",
    "What are the advantages and disadvantages of {t}?",
    "How does {t} work?",
    "Summarize the history of {t} in a few sentences.",
    "Write a short poem about {t}.",
    "What are common misconceptions about {t}?",
    "Give me a simple example of {t}.",
    "What should a beginner know about {t}?",
    "Describe {t} in one paragraph.",
    "List five words related to {t}.",
    "Write a haiku about {t}.",
    "What questions do people often ask about {t}?",
    "How would you teach {t} to a friend?",
    "Write a short story that involves {t}.",
    "What is the future of {t}?",
    "Compare {t} with something similar.",
    "Give me a fun fact about {t}.",
    "What are the main parts of {t}?",
    "Can you write a tweet about {t}?",
    "What are some tips for getting started with {t}?",
    "Write an email to a friend about {t}.",
    "What problems does {t} solve?",
    "Tell me a joke about {t}.",
    "What would happen without {t}?",
    "Describe a day in the life of someone who works with {t}.",
    "Give me three tips about {t}.",
    "What is the science behind {t}?",
    "Why do people like {t}?",
    "Explain the basics of {t}.",
    "Write a limerick about {t}.",
    "What are three interesting things about {t}?",
    "Describe {t} to someone who has never seen it.",
    "Give me some advice about {t}.",
    "What is the difference between {t} and something people confuse it with?",
    "Write a short speech about {t}.",
    "How has {t} changed over time?",
    "What do scientists know about {t}?",
]

TOPICS = [
    "photosynthesis", "gravity", "the internet", "black holes", "democracy", "vaccines",
    "the water cycle", "electricity", "volcanoes", "machine learning", "the Roman Empire",
    "coffee", "bicycles", "recycling", "the human heart", "solar panels", "honey bees",
    "chess", "the stock market", "earthquakes", "DNA", "the moon", "pizza", "meditation",
    "sleep", "the printing press", "batteries", "friendship", "museums", "libraries",
    "the piano", "soccer", "basketball", "elephants", "dolphins", "forests", "deserts",
    "the Great Wall of China", "the Eiffel Tower", "airplanes", "trains", "electric cars",
    "smartphones", "social media", "cloud computing", "encryption", "passwords",
    "exercise", "nutrition", "vitamins", "bread", "cheese", "chocolate", "tea", "rice",
    "the French Revolution", "ancient Egypt", "the pyramids", "dinosaurs", "fossils",
    "evolution", "atoms", "magnets", "light", "sound", "microscopes", "telescopes", "Mars",
    "Jupiter", "the Sun", "comets", "satellites", "rockets", "robots", "3D printing",
    "video games", "movies", "painting", "photography", "poetry", "novels", "theater",
    "jazz", "opera", "dance", "yoga", "running", "swimming", "cooking", "gardening",
    "composting", "bees and flowers", "cats", "dogs", "horses", "owls", "penguins",
    "coral reefs", "rivers", "mountains", "glaciers", "islands", "cities", "villages",
    "bridges", "skyscrapers", "roads", "maps", "compasses", "clocks", "calendars",
    "money", "banks", "taxes", "budgeting", "saving money", "job interviews", "resumes",
    "teamwork", "leadership", "public speaking", "time management", "habits",
    "procrastination", "stress", "happiness", "kindness", "curiosity", "creativity",
    "mathematics", "prime numbers", "fractions", "geometry", "statistics", "probability",
    "algebra", "Python programming", "databases", "operating systems", "web browsers",
    "email", "spreadsheets", "keyboards", "computer memory", "the CPU", "algorithms",
    "sorting", "recursion", "open source software", "Wikipedia", "newspapers", "radio",
    "television", "the telephone", "the wheel", "fire", "farming", "wheat", "tomatoes",
    "apples", "bananas", "oranges", "potatoes", "fishing", "sailing", "camping", "hiking",
    "birthdays", "weddings", "holidays", "board games", "puzzles", "magic tricks",
    "archaeology", "languages", "grammar", "writing essays", "reading", "handwriting",
    "the alphabet", "kindergarten", "universities", "scholarships", "homework",
    "climate change", "renewable energy", "wind turbines", "nuclear power", "oil",
    "plastic pollution", "clean water", "air quality", "hurricanes", "tornadoes",
    "snow", "deserts at night", "the ocean floor", "sharks", "whales", "octopuses",
    "butterflies", "ants", "spiders", "frogs", "snakes", "trees", "mushrooms", "moss",
    "clouds", "thunderstorms", "lightning", "fog", "tides", "eclipses", "the northern lights",
    "stars", "galaxies", "the speed of light", "mirrors", "lenses", "shadows",
    "snowflakes", "ice", "steam", "rain",
    "the violin", "drums", "the flute", "singing", "choirs", "orchestras", "rock music",
    "folk songs", "learning a language", "learning to swim", "learning to draw",
    "learning to cook", "learning to code", "knitting", "woodworking", "pottery",
    "origami", "skateboarding", "tennis", "cycling", "marathons", "rock climbing", "surfing",
    "skiing", "the Olympic Games", "the human brain", "the immune system", "bones",
    "muscles", "the lungs", "digestion", "teeth", "eyes", "hearing", "memory", "dreams",
    "emotions", "laughter", "bacteria", "viruses", "cells", "plants", "seeds", "roots",
    "flowers", "pollination", "soil", "rocks", "minerals", "crystals", "diamonds", "gold",
    "iron", "copper", "salt", "sugar", "oxygen", "carbon", "hydrogen", "chemical reactions",
    "friction", "energy", "heat", "temperature", "pressure", "magnetism", "electric circuits",
    "engines", "cars", "ships", "submarines", "helicopters", "hot air balloons",
    "the postal service", "supermarkets", "restaurants", "hospitals", "fire fighters",
    "police", "courts", "elections", "the United Nations", "maps of the world",
    "rainforests", "the Amazon River", "the Sahara", "Antarctica", "the Arctic", "oceans",
    "lakes", "waterfalls", "caves", "canyons", "national parks", "zoos", "farms", "cows",
    "chickens", "sheep", "wolves", "bears", "lions", "tigers", "giraffes", "kangaroos",
    "migration of birds", "bird nests", "ecosystems", "food chains", "endangered species",
    "pets", "the Moon landing", "the Industrial Revolution", "the Renaissance",
    "ancient Greece", "the Vikings", "castles", "knights", "samurai", "inventions",
    "Leonardo da Vinci", "Albert Einstein", "Isaac Newton", "Marie Curie", "Charles Darwin",
]


# Questions on topics that no training topic (nor demo question) shares a content word with
# (new_topic_questions checks): how a draft does on a question unlike any it trained on. The
# held-out answers overstate that: their topics were trained on, under other templates.
NEW_TOPICS = [
    "Give me three tips for keeping houseplants alive.",
    "Write a short poem about a lighthouse.",
    "What is the difference between a virus and a bacterium?",
    "Why do we dream?",
    "How does a compass work?",
    "Write a short poem about a winter morning.",
    "What is the difference between a lake and a pond?",
    "Explain how a bicycle gear works.",
    "What causes thunder?",
    "What is inflation?",
    "Explain how a camera captures a photo.",
    "What is the difference between a crocodile and an alligator?",
    "How do fireflies glow?",
    "Why do onions make us cry?",
    "What is the difference between a sprain and a fracture?",
    "Give me three tips for packing a suitcase.",
    "Write a short poem about a kitten.",
    "Why do zebras have stripes?",
    "How does a thermostat work?",
    "What causes hiccups?",
    "Give me three tips for caring for a puppy.",
    "Explain how a lock and key work.",
    "What is the difference between a frog and a toad?",
    "Why do we yawn?",
    "Write a short poem about a candle.",
    "Explain how an elevator works.",
    "What is the difference between a hurricane and a tornado?",
    "Write a short poem about a teapot.",
    "What causes rust?",
    "Give me three tips for a long flight.",
    "Explain how a zipper works.",
    "What is the difference between jam and jelly?",
    "Why do roosters crow?",
]
# Words of a question that say how it is asked, not what about.
FORM_WORDS = {"what", "the", "on", "me", "for", "to", "a", "an", "how", "is", "of", "and", "about",
              "between", "give", "write", "short", "explain", "three", "tips", "do", "does",
              "why", "we", "us", "make", "in", "are", "work", "works", "causes", "difference",
              "poem"}


def held_out_words():
    """Lower-case words of the held-out questions that would make a training question too close."""
    # And three words of the demo's questions too common to keep out of training topics.
    stop = FORM_WORDS | {"learning", "play", "forms"}
    words = set()
    for question in HELD_OUT:
        for word in question.lower().replace("?", " ").replace(".", " ").split():
            if word not in stop:
                words.add(word)
    return words


def training_prompts(count, seed):
    """`count` distinct questions, none sharing a topic word with HELD_OUT, in a seeded order."""
    banned = held_out_words()
    topics = [t for t in TOPICS if not (set(t.lower().split()) & banned)]
    pairs = [(template, topic) for template in TEMPLATES for topic in topics]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    if count > len(pairs):
        raise SystemExit(f"chat_prompts: asked for {count} questions, only {len(pairs)} exist")
    return [template.format(t=topic) for template, topic in pairs[:count]]


def new_topic_questions():
    """NEW_TOPICS, refused if a training topic or a demo question shares a content word with one."""
    taken = {word for topic in TOPICS for word in topic.lower().split()} | held_out_words()
    for question in NEW_TOPICS:
        words = {w.strip("?.,") for w in question.lower().split()} - FORM_WORDS
        if words & taken:
            raise SystemExit(f"chat_prompts: '{question}' shares {sorted(words & taken)} with the "
                             "training topics or the demo's questions")
    return NEW_TOPICS
