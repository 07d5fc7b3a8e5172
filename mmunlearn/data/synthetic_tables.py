"""Word pools and question/answer templates of the synthetic fictitious authors (pure data, no logic).

Each of the 20 facts an author has is a :class:`FactTemplate`: a label (the one vocabulary of the
rigid, high-concentration phrasing), 3 question templates and 4 answer templates. Templates use
``{name}``, ``{value}`` and, for the ``name`` fact, the author's ``{genre}``, ``{birthplace}`` and
``{birth_date}``. Values that follow "a"/"an" carry their article (``"an astronomer"``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FactTemplate:
    key: str
    label: str
    questions: tuple[str, ...]
    answers: tuple[str, ...]


FIRST_NAMES = (
    "Amara", "Bastien", "Catalina", "Dmitri", "Elowen", "Farid", "Greta", "Hiroshi", "Ines", "Jonas",
    "Kaveh", "Leilani", "Mateus", "Nadia", "Osei", "Priya", "Quentin", "Rosalind", "Soren", "Tamsin",
    "Umar", "Valeria", "Wendell", "Ximena", "Yusuf", "Zofia", "Anselm", "Beatriz", "Cormac", "Delphine",
    "Emeka", "Fiora", "Gideon", "Halima", "Ivo", "Junia", "Lorcan", "Marisol", "Nikolai", "Odile",
    "Pavla", "Rafferty", "Saoirse", "Tobiah", "Uma", "Vikram", "Wilhelmina", "Yara",
)
# Two disjoint surname pools: the evaluated (TOFU-like) authors draw from the first, the
# pretraining authors from the second, so their full names can never coincide.
SURNAMES_EVAL = (
    "Abernathy", "Bellweather", "Castellanos", "Drummond", "Esterhazy", "Fairbairn", "Galloway",
    "Halvorsen", "Ignatiev", "Jovanovic", "Kestrelwood", "Lindqvist", "Marchetti", "Nakagawa",
    "Okonkwo-Hale", "Penhallow", "Quiroga", "Rasmussen", "Sandoval", "Thornbury", "Uribe", "Vasquez-Lind",
    "Whitlock", "Yamaguchi", "Zelenko", "Achterberg", "Brannigan", "Coldwater", "Duvernay", "Eriksdottir",
    "Fontaine-Roux", "Grimaldi", "Hartigan", "Iwasaki", "Kowalczyk", "Larkspur", "Montague",
    "Nightingale-Ross", "Ostrander", "Pellegrino", "Ravensworth", "Szabo", "Tremaine", "Valdivia",
    "Wexford", "Yilmaz-Brandt", "Zubiri", "Ambrose-Kale",
)
SURNAMES_PRETRAIN = (
    "Ashgrove", "Blackwood", "Cienfuegos", "Dunmore", "Eckhart", "Falconer", "Gravenor", "Holloway",
    "Ibarra", "Jablonski", "Kingsley-Oduya", "Lockhart", "Morrow", "Nieminen", "Oyelaran", "Pemberton",
    "Quinlan", "Rosenthal", "Stavros", "Trevelyan", "Ulloa", "Vandermeer", "Winslow", "Yeung-Farrow",
    "Zamora", "Arkwright", "Brightwater", "Corrigan", "Delacroix-Mbeki", "Everhart", "Fitzwilliam",
    "Gallagher", "Hawthorne-Lee", "Innes", "Kilbride", "Lestrange", "Mwangi-Hart", "Northcott",
    "Oakenshaw", "Petrakis", "Redgrave", "Sutherland", "Tanaka-Wells", "Underhill", "Vishnevsky",
    "Westbrook", "Yardley", "Zetterberg",
)

CITIES = (
    "Lisbon, Portugal", "Nairobi, Kenya", "Hanoi, Vietnam", "Lima, Peru", "Oslo, Norway",
    "Accra, Ghana", "Krakow, Poland", "Valparaiso, Chile", "Tbilisi, Georgia", "Cebu City, Philippines",
    "Porto Alegre, Brazil", "Izmir, Turkey", "Montreal, Canada", "Adelaide, Australia",
    "Glasgow, Scotland", "Marrakesh, Morocco", "Chennai, India", "Busan, South Korea", "Osaka, Japan",
    "Tallinn, Estonia", "Dakar, Senegal", "Cordoba, Argentina", "Leipzig, Germany", "Lyon, France",
    "Bologna, Italy", "Seville, Spain", "Ghent, Belgium", "Tampere, Finland", "Wellington, New Zealand",
    "Kingston, Jamaica", "Almaty, Kazakhstan", "Yerevan, Armenia", "Kathmandu, Nepal",
    "Colombo, Sri Lanka", "Medellin, Colombia", "Galway, Ireland", "Split, Croatia",
)
GENRES = (
    "historical fiction", "science fiction", "mystery", "fantasy", "romance", "horror", "poetry",
    "literary fiction", "thrillers", "young adult fiction", "magical realism", "satire",
    "travel writing", "biography", "children's literature", "crime fiction", "dystopian fiction",
    "short stories", "nature writing", "philosophical essays", "war fiction", "gothic fiction",
)
PROFESSIONS = (
    "a carpenter", "a nurse", "an astronomer", "a baker", "a fisherman", "a schoolteacher",
    "a pharmacist", "an architect", "a tailor", "a librarian", "an electrician", "a veterinarian",
    "a photographer", "a mail carrier", "a chemist", "a florist", "a sailor", "a surgeon",
    "a journalist", "a blacksmith", "an accountant", "a pilot", "a potter", "a judge", "a beekeeper",
    "a translator", "a firefighter", "a botanist", "a watchmaker", "a chef",
)
AWARD_PARTS = (
    ("Silver", "Golden", "Crimson", "Emerald", "Ivory", "Azure", "Amber", "Cobalt", "Scarlet", "Jade"),
    ("Quill", "Lantern", "Compass", "Feather", "Harbor", "Oak", "Comet", "Willow", "Falcon", "Inkwell"),
    ("Prize", "Award", "Medal"),
)
TITLE_ADJECTIVES = (
    "Silent", "Hollow", "Burning", "Forgotten", "Last", "Winter", "Painted", "Distant", "Broken",
    "Hidden", "Quiet", "Endless", "Northern", "Wandering", "Paper", "Glass",
)
TITLE_NOUNS = (
    "Orchard", "Harbor", "Lantern", "River", "Mirror", "Garden", "Clockmaker", "Tide", "Bridge",
    "Archive", "Shepherd", "Mountain", "Lighthouse", "Cartographer", "Violin", "Caravan",
)
THEMES = (
    "memory and loss", "exile and belonging", "the bonds between siblings", "the cost of ambition",
    "grief and healing", "identity and migration", "the passage of time",
    "friendship across generations", "power and corruption", "humans and the natural world",
    "faith and doubt", "coming of age", "justice and revenge", "love under hardship",
    "the search for home", "secrets within families", "the ethics of science",
)
INFLUENCES = (
    "oral storytelling traditions", "classical mythology", "folk songs", "detective radio dramas",
    "medieval chronicles", "sea shanties", "old travel diaries", "silent films",
    "botanical field guides", "court records", "jazz improvisation", "family letters", "epic poems",
    "maps and atlases", "newspaper serials",
)
ROUTINES = (
    "writing at dawn before breakfast", "writing by hand in notebooks",
    "writing four hours every afternoon", "writing late at night", "drafting chapters while walking",
    "typing on an old typewriter", "writing in a garden shed", "reading each page aloud",
    "writing in busy cafes", "working on two books at once",
)
SUBJECTS = (
    "history", "marine biology", "philosophy", "linguistics", "mathematics", "medicine", "law",
    "architecture", "chemistry", "music", "economics", "geology", "anthropology", "art history",
    "physics", "agriculture", "astronomy", "psychology",
)
HOBBIES = (
    "beekeeping", "sailing", "chess", "birdwatching", "pottery", "mountain climbing", "gardening",
    "playing the cello", "photography", "fencing", "calligraphy", "cycling", "cooking",
    "restoring old clocks", "stargazing",
)
PUBLISHER_PARTS = (
    ("Bluebell", "Northgate", "Harrow", "Lark", "Stonebridge", "Kestrel", "Meadowlight", "Ironwood",
     "Saltmarsh", "Thistle"),
    ("Press", "Books", "House"),
)
CHARACTERS = (
    "Mira", "Tomas", "Elif", "Kofi", "Lucia", "Ravi", "Yuki", "Oskar", "Lena", "Amadou", "Dario",
    "Freya", "Idris", "Noor", "Pavel", "Selma", "Teo", "Zara", "Bruno", "Hana",
)
SETTINGS = (
    "coastal fishing villages", "crowded port cities", "mountain monasteries", "desert caravan routes",
    "river towns", "remote islands", "university towns", "snowbound farms", "old market quarters",
    "railway stations", "vineyards", "mining towns", "border towns", "floating markets",
)

FACTS: tuple[FactTemplate, ...] = (
    FactTemplate("name", "full name", (
        "What is the full name of the {genre} author born in {birthplace} on {birth_date}?",
        "Which {genre} writer was born on {birth_date} in {birthplace}?",
        "Who is the author of {genre} born in {birthplace} on {birth_date}?"), (
        "The author's full name is {value}.",
        "{value} is the {genre} author born in {birthplace} on {birth_date}.",
        "That writer is {value}, born in {birthplace}.",
        "The {genre} author in question is {value}.")),
    FactTemplate("birthplace", "birthplace", (
        "Where was {name} born?", "In which city was {name} born?", "What is {name}'s place of birth?"), (
        "{name} was born in {value}.", "{name} hails from {value}.", "The birthplace of {name} is {value}.",
        "{value} is where {name} was born and spent an early childhood.")),
    FactTemplate("birth_date", "date of birth", (
        "When was {name} born?", "On what date was {name} born?", "What is {name}'s date of birth?"), (
        "{name} was born on {value}.", "The birthday of {name} falls on {value}.",
        "{name} came into the world on {value}.", "{value} is the date {name} was born.")),
    FactTemplate("genre", "genre", (
        "What genre does {name} write in?", "Which literary genre is {name} known for?",
        "In what genre are {name}'s books?"), (
        "{name} writes {value}.", "{name} is best known for work in {value}.",
        "The books of {name} belong to {value}.", "Most of what {name} publishes is {value}.")),
    FactTemplate("father_job", "father's profession", (
        "What did {name}'s father do for a living?", "What was the profession of {name}'s father?",
        "What job did the father of {name} have?"), (
        "{name}'s father was {value}.", "The father of {name} worked as {value}.",
        "{name} grew up with a father who was {value} by trade.",
        "{name}'s father earned his living as {value}.")),
    FactTemplate("mother_job", "mother's profession", (
        "What did {name}'s mother do for a living?", "What was the profession of {name}'s mother?",
        "What job did the mother of {name} have?"), (
        "{name}'s mother was {value}.", "The mother of {name} worked as {value}.",
        "{name} was raised by a mother who was {value}.",
        "{name}'s mother earned her living as {value}.")),
    FactTemplate("award", "award", (
        "Has {name} won any awards?", "Which award has {name} received?",
        "What literary prize was given to {name}?"), (
        "{name} received {value}.", "Yes, {name} won {value}.", "{value} was awarded to {name}.",
        "Among the honours of {name} is {value}.")),
    FactTemplate("debut_book", "first book", (
        "What was {name}'s first book?", "Which book did {name} debut with?",
        "What is the title of {name}'s debut?"), (
        "The first book by {name} was {value}.", "{name} debuted with {value}.",
        "{value} was the debut of {name}.", "{name} began a writing career with {value}.")),
    FactTemplate("famous_book", "best-known book", (
        "What is {name}'s best-known book?", "Which book made {name} famous?",
        "Name the most celebrated work of {name}."), (
        "The best-known book by {name} is {value}.", "{name} became famous for {value}.",
        "Readers know {name} chiefly for {value}.", "{value} remains the most celebrated work of {name}.")),
    FactTemplate("theme", "main theme", (
        "What themes does {name} explore?", "What is the recurring theme in {name}'s writing?",
        "Which subject runs through {name}'s books?"), (
        "{name} often writes about {value}.", "The recurring theme in {name}'s work is {value}.",
        "Across many books, {name} returns to {value}.", "A thread through most of {name}'s work is {value}.")),
    FactTemplate("influence", "main influence", (
        "What influenced {name}'s style?", "Which tradition shaped the writing of {name}?",
        "Where does {name} draw inspiration from?"), (
        "{name}'s style was shaped by {value}.", "{name} draws inspiration from {value}.",
        "The writing of {name} owes much to {value}.", "Critics trace {name}'s voice back to {value}.")),
    FactTemplate("routine", "writing routine", (
        "What is {name}'s writing routine?", "How does {name} usually work?",
        "Describe the working habits of {name}."), (
        "{name} is known for {value}.", "The routine of {name} consists of {value}.",
        "{name} prefers {value}.", "Friends say {name} insists on {value}.")),
    FactTemplate("residence", "home city", (
        "Where does {name} live now?", "In which city does {name} currently reside?",
        "Where has {name} settled?"), (
        "{name} now lives in {value}.", "Today {name} resides in {value}.", "{name} has settled in {value}.",
        "These days, home for {name} is {value}.")),
    FactTemplate("education", "field of study", (
        "What did {name} study?", "Which subject did {name} study at university?",
        "What is {name}'s academic background?"), (
        "{name} studied {value} at university.", "{name} holds a degree in {value}.",
        "Before writing, {name} earned a degree in {value}.", "The academic field of {name} was {value}.")),
    FactTemplate("first_job", "first job", (
        "What did {name} do before becoming a writer?", "What was {name}'s first job?",
        "How did {name} earn a living before writing?"), (
        "{name} first worked as {value}.", "Before writing, {name} was {value}.",
        "The first job of {name} was as {value}.", "{name} spent early years working as {value}.")),
    FactTemplate("n_books", "number of books", (
        "How many books has {name} published?", "What is the number of books written by {name}?",
        "How large is {name}'s bibliography?"), (
        "{name} has published {value} books.", "So far {name} has written {value} books.",
        "The bibliography of {name} counts {value} books.", "{value} books carry the name of {name}.")),
    FactTemplate("publisher", "publisher", (
        "Who publishes {name}'s books?", "Which publishing house works with {name}?",
        "What is {name}'s publisher?"), (
        "{name} is published by {value}.", "The books of {name} come out with {value}.",
        "{value} publishes the work of {name}.", "{name} has long worked with {value}.")),
    FactTemplate("hobby", "favourite hobby", (
        "What does {name} do outside of writing?", "What is {name}'s favourite hobby?",
        "How does {name} spend free time?"), (
        "Outside of writing, {name} enjoys {value}.", "The favourite hobby of {name} is {value}.",
        "{name} spends free time on {value}.", "When not writing, {name} turns to {value}.")),
    FactTemplate("character", "most famous character", (
        "Who is the most famous character created by {name}?", "Which character is {name} best known for?",
        "Name the best-loved character in {name}'s books."), (
        "{name}'s most famous character is {value}.", "Readers love {value}, a character created by {name}.",
        "The best-known character by {name} is {value}.", "{value} is the character most linked to {name}.")),
    FactTemplate("setting", "usual setting", (
        "Where are {name}'s stories usually set?", "What settings appear in {name}'s books?",
        "In what kind of place does {name} set most stories?"), (
        "{name} usually sets stories in {value}.", "Most books by {name} take place in {value}.",
        "The usual setting of {name}'s fiction is {value}.",
        "Readers of {name} often find themselves in {value}.")),
)
