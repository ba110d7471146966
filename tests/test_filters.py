"""Passage filters (filters.py): a filtered search never returns a passage outside its filter, for
every search type the agent uses, and still fills ``k`` when the filter admits enough."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import filters
import load_corpus
import main
import question as question_mod
import rag_utils
from context import AgentContext
from settings import SettingsError

pytestmark = pytest.mark.usefixtures("fresh_rag_caches")

WORDS = "expectation damages for breach of contract: the benefit of the bargain remedy"


def _passage(pid, n, **meta):
    return {
        "idx": pid,
        "text": f"{WORDS}, passage {pid} on lost profits number {n} and its remedy.",
        "source": meta.pop("source", "user documents"),
        "title": f"Passage {pid}",
        **meta,
    }


def _cases(prefix, court, jurisdiction, first_year, count):
    """``count`` dated opinions of one court, a year apart."""
    return [
        _passage(
            f"{prefix}_case_{n}",
            n,
            jurisdiction=jurisdiction,
            court=court,
            authority_type="case",
            date_int=(first_year + n) * 10000 + 101,
        )
        for n in range(count)
    ]


PASSAGES = [
    *_cases("tx", "tex", "TX", 1990, 6),
    *_cases("ca9", "ca9", "US", 2010, 4),
    _passage("usc_1441", 1, jurisdiction="US", authority_type="statute"),
    _passage("fre_803", 2, source="Federal Rules of Evidence"),  # legacy row: court_rule, US
    *[_passage(f"mbe_{n}", n, source="barexam_qa:mbe") for n in range(4)],  # secondary, no place
]
BY_ID = {p["idx"]: p for p in PASSAGES}
SEARCHES = ("dense", "keyword", "hybrid", "hybrid+keyword")


@pytest.fixture
def store(tmp_settings, fake):
    load_corpus.load_passages(PASSAGES, tmp_settings, progress=False)
    return tmp_settings


def _search(settings, search_type, k=5):
    ctx = AgentContext.from_settings(settings, client=object())
    return ctx.search(search_type, ["expectation damages for breach of contract"], k, [])


def _admitted(flt, pid):
    p = BY_ID[pid]
    meta = {k: v for k, v in p.items() if k not in ("idx", "text", "source", "title")}
    return flt.admits(pid, p["source"], meta)


CASES = [
    ({"filter_jurisdiction": "texas"}, {f"tx_case_{n}" for n in range(6)}),
    ({"filter_court": "ca9"}, {f"ca9_case_{n}" for n in range(4)}),
    ({"filter_source_type": "statute,court_rule"}, {"usc_1441", "fre_803"}),
    ({"filter_source_type": "secondary"}, {f"mbe_{n}" for n in range(4)}),
    ({"filter_jurisdiction": "US", "filter_after": "2011"}, {f"ca9_case_{n}" for n in (1, 2, 3)}),
    ({"filter_before": "1992-06"}, {"tx_case_0", "tx_case_1", "tx_case_2"}),
]


@pytest.mark.parametrize("search_type", SEARCHES)
@pytest.mark.parametrize(("overrides", "inside"), CASES)
def test_a_filtered_search_returns_only_what_the_filter_admits(
    store, search_type, overrides, inside
):
    settings = store.replace(**overrides)
    flt = filters.passage_filter(settings)
    assert {pid for pid in BY_ID if _admitted(flt, pid)} == inside
    got = [d["id"] for d in _search(settings, search_type)]
    assert set(got) <= inside, (
        f"{search_type} returned {set(got) - inside} outside {flt.describe()}"
    )
    assert len(got) == min(5, len(inside))  # the filter is applied first: k is still filled


def test_unfiltered_search_returns_passages_of_every_kind(store):
    got = {d["id"] for d in _search(store, "hybrid", k=len(PASSAGES))}
    assert got == set(BY_ID)


@pytest.mark.parametrize("exact_filter", [0, rag_utils.EXACT_FILTER_MAX_PASSAGES])
def test_the_hnsw_path_of_a_large_collection_is_filtered_too(store, monkeypatch, exact_filter):
    """Above EXACT_SEARCH_MAX_PASSAGES a filter goes to Chroma's id filter, or, when it admits at
    most EXACT_FILTER_MAX_PASSAGES, to an exact search over the admitted passages' vectors."""
    monkeypatch.setattr(rag_utils, "EXACT_SEARCH_MAX_PASSAGES", 0)
    monkeypatch.setattr(rag_utils, "EXACT_FILTER_MAX_PASSAGES", exact_filter)
    settings = store.replace(filter_court="tex")
    got = [d["id"] for d in _search(settings, "dense")]
    assert len(got) == 5 and all(pid.startswith("tx_case_") for pid in got)


def test_a_filter_admitting_few_passages_is_searched_exactly_and_its_vectors_kept(
    store, monkeypatch
):
    """The nearest admitted passages by cosine, as a search of every admitted vector finds them;
    the vectors are read from the store once and read back by the next process, and a delete
    drops them."""
    monkeypatch.setattr(rag_utils, "EXACT_SEARCH_MAX_PASSAGES", 0)
    texas = filters.passage_filter(store.replace(filter_jurisdiction="texas"))
    chroma = rag_utils.get_store(store)
    allowed = chroma.allowed_ids(texas)
    query = rag_utils.get_embedder(store).embed_documents(["expectation damages for breach"])
    rows = {p["id"]: p["embedding"] for p in chroma.get(sorted(allowed), with_embeddings=True)}
    mat = rag_utils._unit(np.asarray([rows[i] for i in sorted(rows)], dtype=np.float32))
    scores = mat @ np.asarray(query[0], dtype=np.float32)
    nearest = [sorted(rows)[i] for i in np.argsort(-scores, kind="stable")[:4]]
    with monkeypatch.context() as m:
        m.setattr(chroma.collection, "query", lambda **kw: pytest.fail("Chroma's id filter"))
        assert chroma.query_ids(query, 4, allowed) == [nearest]
    rag_utils.reset_caches()  # a new process: the vectors are read back, not fetched
    fresh = rag_utils.get_store(store)
    with monkeypatch.context() as m:
        m.setattr(type(fresh), "_by_ids", lambda *a, **k: pytest.fail("fetched again"))
        assert fresh.query_ids(query, 4, allowed) == [nearest]
    fresh.delete(["tx_case_0"])
    assert not list(fresh._filters_dir().glob(f"{fresh.name}-*"))


def test_what_a_filter_admits_is_scanned_once_and_kept_for_the_next_process(store, monkeypatch):
    texas = filters.passage_filter(store.replace(filter_jurisdiction="texas"))
    ca9 = filters.passage_filter(store.replace(filter_court="ca9"))
    tx_ids, ca9_ids = CASES[0][1], CASES[1][1]
    assert rag_utils.get_store(store).allowed_ids(texas) == tx_ids
    assert rag_utils.get_store(store).allowed_ids(ca9) == ca9_ids  # each filter its own file
    rag_utils.reset_caches()  # a new process: read back, no scan
    fresh = rag_utils.get_store(store)
    with monkeypatch.context() as m:
        m.setattr(type(fresh), "iter_all", lambda *a, **k: pytest.fail("rescanned"))
        assert fresh.allowed_ids(texas) == tx_ids and fresh.allowed_ids(ca9) == ca9_ids
    # a delete and an add leave the count as it was: the saved sets are dropped, not reused
    fresh.delete(["tx_case_0"])
    load_corpus.load_passages(
        [_passage("tx_case_9", 9, jurisdiction="CA", court="cal", authority_type="case")],
        store,
        progress=False,
    )
    rag_utils.reset_caches()
    assert rag_utils.get_store(store).allowed_ids(texas) == tx_ids - {"tx_case_0"}
    load_corpus.load_passages(
        [_passage("tx_case_10", 10, jurisdiction="TX")], store, progress=False
    )
    assert rag_utils.get_store(store).allowed_ids(texas) == tx_ids - {"tx_case_0"} | {"tx_case_10"}


def test_a_filter_that_admits_nothing_returns_nothing(store):
    assert _search(store.replace(filter_court="scotus"), "hybrid") == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("filter_jurisdiction", "Narnia", "FILTER_JURISDICTION"),
        ("filter_source_type", "treatise", "FILTER_SOURCE_TYPE=treatise"),
        ("filter_after", "last year", "FILTER_AFTER"),
        ("filter_court", "scotus,xyz", "FILTER_COURT: unknown court 'xyz'"),  # filtered nothing
    ],
)
def test_a_bad_filter_value_is_a_settings_error_naming_the_setting(
    tmp_settings, field, value, message
):
    with pytest.raises(SettingsError, match=message):
        filters.PassageFilter.from_settings(tmp_settings.replace(**{field: value}))


def test_filters_that_no_indexed_passage_meets_stop_the_run_before_any_model_call(
    store, monkeypatch, capsys
):
    """A court no passage is from, or a date range the (undated) corpus misses, abstained as
    "off topic" after two model calls; now one line says no passage matches."""
    monkeypatch.setenv("CHROMA_DIR", store.retrieval.chroma_dir)
    monkeypatch.setenv("RERANKER", "hybrid")
    monkeypatch.setenv("LLM_PROVIDER", "local")
    assert main.main(["--no-index", "--court", "scotus", "What is expectation damages?"]) == 2
    err = capsys.readouterr().err
    assert "no indexed passage matches the passage filters (court scotus)" in err
    assert "detect_injection" not in err


def test_a_date_that_is_not_on_the_calendar_or_a_range_that_ends_before_it_starts_is_refused(
    tmp_settings,
):
    with pytest.raises(ValueError, match="is not a date"):
        filters.parse_date("2020-02-30")
    assert filters.parse_date("2020-02", end=True) == 20200231  # an inclusive bound
    with pytest.raises(SettingsError, match="FILTER_AFTER=2020 is later than FILTER_BEFORE=2010"):
        filters.PassageFilter.from_settings(
            tmp_settings.replace(filter_after="2020", filter_before="2010")
        )


def test_dates_cover_whole_years_and_months():
    assert filters.parse_date("2001") == 20010101
    assert filters.parse_date("2001", end=True) == 20011231
    assert filters.parse_date("2001-02-03") == 20010203
    flt = filters.PassageFilter(after=filters.parse_date("1995"))
    assert flt.describe() == "after 1995-01-01"
    assert not filters.PassageFilter()


def test_main_and_the_eval_scripts_take_the_filter_flags():
    import eval_comprehensive
    import eval_reranker
    import eval_trace
    import main

    argv = ["--jurisdiction", "TX", "--source-type", "case", "--after", "2000"]
    for parser in (
        main.build_parser(),
        eval_trace.build_parser(),
        eval_reranker.build_parser(),
        eval_comprehensive.build_parser(),
        eval_comprehensive.build_answers_parser(),
    ):
        args, _ = parser.parse_known_args(argv)
        assert filters.overrides(args)["filter_jurisdiction"] == "TX"
        assert filters.overrides(args)["filter_after"] == "2000"


@pytest.mark.parametrize(
    ("asked", "state"),
    [
        ("How many days does Ohio law give him to return it with an itemized list?", "OH"),
        ("How much notice does New York law require before a rent increase?", "NY"),
        ("Under California law, can she sue the seller?", "CA"),
        ("In Texas, can my landlord keep the whole deposit?", "TX"),
        ("How many years does Arizona's adverse possession statute require?", "AZ"),
        ("Does Pennsylvania have a law that lets stores detain shoplifters?", "PA"),
        ("What does Illinois’ lemon law cover?", "IL"),
        ("What is Georgia's deadline for filing a personal-injury lawsuit?", "GA"),
        ("Does Washington let landlords charge a late fee that large?", "WA"),
        ("Is that legal in Oregon?", "OR"),
        ("Does the California court have personal jurisdiction over Nadia?", None),
        ("Does California have jurisdiction under its long-arm statute?", None),
        ("Do Ohio's courts have jurisdiction over him?", None),
        ("Can Georgia's landlord keep the whole deposit?", None),
        ("Can I sue him in New York?", None),
        ("May Texas enact a law that bars out-of-state trucks?", None),
        ("Can Texas require doctors to read a script to patients?", None),
        ("Is Ohio's ban on drag shows constitutional?", None),
        ("Can Georgia recover from the store?", None),
        ("Is the State X statute constitutional?", None),
    ],
)
def test_the_state_whose_law_a_question_asks_about(asked, state):
    """A state's law is asked for when its name qualifies a word for law, owns something, has a
    law, does what a law does ("Does Washington let ...") or follows "in" or "under"; a state's
    courts, a forum to sue in, a state that acts, a person named for a state and a bar
    question's "State X" are not."""
    found = filters.jurisdiction_asked(asked)
    assert (found[1] if found else None) == state


STATE_LAW_QUESTIONS = [
    json.loads(line)
    for line in (Path(__file__).parent / "fixtures" / "state_law_questions.jsonl").open()
]
MISREAD = {
    "hs-t04": "a state that does something without a word for its law ('does Pennsylvania put')",
    "hs-t12": "a state's courts that 'let': courts are read as a forum, not as law",
}


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(q, id=q["id"], marks=pytest.mark.xfail(reason=MISREAD[q["id"]], strict=True))
        if q["id"] in MISREAD
        else pytest.param(q, id=q["id"])
        for q in STATE_LAW_QUESTIONS
    ],
)
def test_which_questions_ask_a_states_own_law(item):
    """24 questions written for this check by someone who had not seen the detector: 12 ask what
    a state's own law provides, 12 name a state but ask general or federal law (a forum, a
    state as a party, a state's law tested against federal law).  Read first, the detector got
    20 of 24; the test for federal law (hs-f10) and the possessive's words for law (hs-f06, a
    person named Virginia) were added after, and the two it still misreads are marked."""
    asked = question_mod.split_question(item["question"])[1]
    assert (filters.jurisdiction_asked(asked) is not None) == item["asks_state_law"]


@pytest.mark.parametrize(
    ("asked", "country"),
    [
        ("Under French law, can a tenant be evicted during the winter truce?", "French"),
        ("In Germany, can a landlord evict a tenant in winter?", "German"),
        ("Is the clause valid under the law of England?", "English"),
        ("What does Canadian law say about adverse possession?", "Canadian"),
        ("In the UK, is squatting a crime?", "British"),
        ("Under EU law, is the clause void?", "EU"),
        ("Under English common law, was larceny a felony?", None),
        ("Can an employer in Sweden fire a worker for joining a union?", "Swedish"),
        ("Can my landlord in Germany keep my deposit?", "German"),
        ("Is a contract made in France enforceable in New York?", None),
        ("Can I sue a company in Germany in a US court?", None),
        ("Is a contract in English valid?", None),
        ("Is a French court's judgment enforceable in Ohio?", None),
        ("Can I sue him in New Mexico?", None),
        ("Does federal Indian law apply on the reservation?", None),
        ("What is the English rule on attorney's fees?", None),
        # a stop-56 user trial, answered with US separation-of-powers rules
        ("What is the voting threshold of the Council of the European Union?", "EU"),
        ("Can the Supreme Court of Canada strike down a statute?", "Canadian"),
        ("Is a judgment of the Supreme Court of Canada enforceable in a US court?", None),
        ("Can the citizens of France sue in federal court?", None),
    ],
)
def test_which_questions_ask_another_countrys_law(asked, country):
    """A question asked under another country's law: a user's 'Under French law, can a tenant
    be evicted during the winter truce?' was answered with US landlord-tenant rules, and so was a
    trial's 'an employer in Sweden'.  A country in the facts, where something was done or where
    to sue, its courts, a US state named for it and the common law of England are not."""
    assert filters.foreign_law_asked(asked) == country
