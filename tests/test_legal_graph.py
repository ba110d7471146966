"""The legal knowledge graph: taxonomy, citation and doctrine extraction, the embedded database's
Cypher over a tiny built graph, idempotent loading, the Neo4j contract, and issue spotting."""

from __future__ import annotations

import json
from typing import Any

import pytest

import legal_graph as lg
import load_corpus

DEMO = (
    "A public university suspended a student for a speech at a campus rally in which she "
    "criticized the government on religious grounds, without giving her notice or a hearing. "
    "Which constitutional rights were violated, and what must she show for each claim?"
)

TINY = [
    {
        "idx": "p_hearsay",
        "source": "test",
        "title": "Hearsay defined",
        "text": "Hearsay is an out-of-court statement offered to prove the truth of the matter "
        "asserted. Fed. R. Evid. 801(c). It is inadmissible unless an exception applies.",
    },
    {
        "idx": "p_excited",
        "source": "test",
        "title": "",
        "text": "An excited utterance, a statement relating to a startling event made under the "
        "stress of excitement, is admissible under Rule 803(2).",
    },
    {
        "idx": "p_negligence",
        "source": "test",
        "title": "Negligence",
        "text": "Negligence requires duty, breach, actual cause, proximate cause and damages. "
        "See Palsgraf v. Long Island R. Co. on the duty of care.",
    },
    {
        "idx": "p_diversity",
        "source": "test",
        "title": "Diversity",
        "text": "Under 28 U.S.C. § 1332(a), diversity jurisdiction requires complete diversity "
        "and an amount in controversy exceeding $75,000.",
    },
    {
        "idx": "p_pdp",
        "source": "test",
        "title": "",
        "text": "Procedural due process under the Fourteenth Amendment requires notice and an "
        "opportunity to be heard before a public school expels a student. Goss v. Lopez.",
    },
    {
        "idx": "p_speech",
        "source": "test",
        "title": "",
        "text": "A university campus open to student speakers is a designated public forum; "
        "content-based restrictions there must survive strict scrutiny. U.S. Const. amend. I.",
    },
    {  # a user's document: its chunks carry the document's own citation
        "idx": "terry#0",
        "source": "user documents",
        "title": "Terry v. Ohio",
        "citation": "392 U.S. 1",
        "doc_id": "terry",
        "text": "An officer who reasonably suspects that a person is armed may pat down his outer "
        "clothing for weapons. Evidence seized otherwise is excluded, Mapp v. Ohio, 367 U.S. 643 "
        "(1961).",
    },
    {
        "idx": "p_frisk",
        "source": "test",
        "title": "",
        "text": "A stop and frisk needs reasonable suspicion. Terry v. Ohio, 392 U.S. 1, 27 (1968). "
        "The frisk is limited to a search for weapons. Id. at 29.",
    },
    {
        "idx": "p_exclusion",
        "source": "test",
        "title": "",
        "text": "Evidence from an unconstitutional search is inadmissible in a state prosecution. "
        "See Mapp v. Ohio, 367 U.S. 643, 655 (1961).",
    },
]


# ------------------------------------------------------------------------------------------------
# taxonomy
# ------------------------------------------------------------------------------------------------


def test_taxonomy_covers_the_mbe_subjects_with_several_hundred_doctrines():
    tax = lg.load_taxonomy()
    assert len(tax) >= 300
    assert tax.subjects == [
        "Civil Procedure",
        "Constitutional Law",
        "Contracts and Sales (UCC Article 2)",
        "Criminal Law and Procedure",
        "Evidence",
        "Real Property",
        "Torts",
    ]
    per_subject = {s: sum(d.subject == s for d in tax.doctrines.values()) for s in tax.subjects}
    assert min(per_subject.values()) >= 30, per_subject
    for d in tax.doctrines.values():
        assert d.aliases and d.description and d.name, d.id


def test_demo_issues_exist_with_the_phrasings_a_question_uses():
    tax = lg.load_taxonomy()
    for text, doctrine in [
        ("a campus rally", "conlaw.public_forum"),
        ("a content-based restriction", "conlaw.content_based"),
        ("on religious grounds", "conlaw.free_exercise"),
        ("without notice or a hearing", "conlaw.procedural_due_process"),
        ("the university suspended a student", "conlaw.student_discipline"),
        ("her right to free speech", "conlaw.free_speech"),
    ]:
        assert doctrine in lg.extract_doctrines(text, tax), text
    assert tax.root("conlaw.student_discipline") == "conlaw.procedural_due_process"
    assert tax.root("conlaw.public_forum") == "conlaw.free_speech"


def test_a_broken_taxonomy_is_a_one_line_error_naming_the_file(tmp_path):
    bad = tmp_path / "tax.jsonl"
    bad.write_text(
        json.dumps({"id": "a", "name": "A", "subject": "S", "related_to": ["missing"]}) + "\n"
    )
    with pytest.raises(lg.GraphError, match=r"tax.jsonl: a.related_to names unknown doctrine"):
        lg.load_taxonomy(bad)


# ------------------------------------------------------------------------------------------------
# extraction
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "context", "expected"),
    [
        (
            "jurisdiction under 28 U.S.C. § 1332(a)(1) requires",
            "",
            ("28 U.S.C. § 1332", "28 U.S.C. § 1332"),
        ),
        (
            "removable under 28 U.S.C. § 1441(b) unless",
            "",
            ("28 U.S.C. § 1441", "28 U.S.C. § 1441"),
        ),
        (
            "The officer relied on Terry v. Ohio, 392 U.S. 1 (1968), when he",
            "",
            ("392 U.S. 1", "Terry v. Ohio"),
        ),
        ("a motion under Fed. R. Civ. P. 12(b)(6) tests", "", ("frcp:12", "Fed. R. Civ. P. 12")),
        ("see Federal Rule of Evidence 702", "", ("fre:702", "Fed. R. Evid. 702")),
        ("an excited utterance, FRE 803(2), is", "", ("fre:803", "Fed. R. Evid. 803")),
        ("admissible under Rule 803(2).", "", ("fre:803", "Fed. R. Evid. 803")),
        ("Rule 12(b)(6)", "Federal Rules of Civil Procedure", ("frcp:12", "Fed. R. Civ. P. 12")),
        (
            "Rule 11 applies",
            "Federal Rules of Criminal Procedure",
            ("frcrp:11", "Fed. R. Crim. P. 11"),
        ),
        ("U.S. Const. amend. XIV, § 1 says", "", ("const:amend:14", "U.S. Const. amend. XIV")),
        ("the First Amendment protects", "", ("const:amend:1", "U.S. Const. amend. I")),
        (
            "judicial power under Article III, Section 2",
            "",
            ("const:art:3:2", "U.S. Const. art. III, § 2"),
        ),
        ("a merchant under U.C.C. § 2-207 may", "", ("ucc:2-207", "U.C.C. § 2-207")),
        (
            "In International Shoe Co. v. Washington, the Court held",
            "",
            ("case:international shoe co v washington", "International Shoe Co. v. Washington"),
        ),
        (
            "See Erie R. Co. v. Tompkins. The rule",
            "",
            ("case:erie r co v tompkins", "Erie R. Co. v. Tompkins"),
        ),
    ],
)
def test_citation_patterns(text, context, expected):
    found = [(a.id, a.name) for a, _ in lg.extract_authorities(text, context)]
    assert found == [expected]


def test_short_forms_id_and_supra_resolve_to_the_full_citation():
    text = (
        "Terry v. Ohio, 392 U.S. 1, 27 (1968), allows a frisk. Id. at 29. The officer in "
        "Sibron v. New York, 392 U.S. 40 (1968), lacked suspicion. Terry, 392 U.S. at 30. "
        "See also Terry, supra, at 24."
    )
    found = [(a.id, cite) for a, cite in lg.extract_authorities(text)]
    assert found == [
        ("392 U.S. 1", "392 U.S. 1"),
        ("392 U.S. 1", "Id. at 29"),
        ("392 U.S. 40", "392 U.S. 40"),
        ("392 U.S. 1", "392 U.S. at 30"),
        ("392 U.S. 1", "supra, at 24"),
    ]
    facts = lg.extract({"idx": "x", "text": text})
    auth, cites = facts.authorities["392 U.S. 1"]
    assert auth.name == "Terry v. Ohio" and len(cites) == 4


def test_statute_id_after_a_statute_and_a_short_form_without_its_full_cite():
    found = lg.extract_authorities("Removal is governed by 28 U.S.C. § 1441(b). Id. § 1446.")
    assert [a.id for a, _ in found] == ["28 U.S.C. § 1441", "28 U.S.C. § 1441"]
    # a short form whose full citation is in another passage names no first page: left out
    assert lg.extract_authorities("The frisk was lawful. 392 U.S., at 30.") == []


def test_a_document_is_the_authority_of_its_own_citation_and_does_not_cite_itself():
    facts = lg.extract(TINY[6])
    assert facts.document == lg.Authority("392 U.S. 1", "Terry v. Ohio", "case")
    assert list(facts.authorities) == ["367 U.S. 643"]
    stored = lg.extract({"id": "s#1", "text": "Held, 392 U.S. at 5.", "metadata": {
        "citation": "Terry v. Ohio, 392 U.S. 1 (1968)"}})  # fmt: skip
    assert stored.document == lg.Authority("392 U.S. 1", "Terry v. Ohio", "case")
    assert lg.extract({"idx": "y", "text": "no citation"}).document is None


def test_bare_rule_without_a_family_hint_is_not_guessed():
    assert lg.extract_authorities("Rule 12(b)(6) was invoked") == []
    assert lg.extract_authorities("§ 52-557n of the state code") == []


def test_doctrine_mentions_are_whole_word_case_insensitive_longest_match():
    tax = lg.load_taxonomy()
    got = lg.extract_doctrines("SUBSTANTIVE DUE PROCESS protects fundamental rights", tax)
    assert "conlaw.substantive_due_process" in got
    assert "conlaw.procedural_due_process" not in got  # "due process" is inside the longer alias
    assert lg.extract_doctrines("hearsays and overhearsay", tax) == {}
    assert lg.extract_doctrines("Hearsay, hearsay and res ipsa loquitur", tax) == {
        "evidence.hearsay": 2,
        "torts.res_ipsa": 1,
    }


# ------------------------------------------------------------------------------------------------
# the embedded database over a tiny built graph
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def graph_settings(tmp_settings, fresh_rag_caches):
    lg.close_graphs()
    yield tmp_settings
    lg.close_graphs()


@pytest.fixture
def tiny_graph(graph_settings):
    """The TINY passages in the embedded graph (no vector store)."""
    assert lg.add_passages(TINY, graph_settings) == len(TINY)
    return lg.get_graph(graph_settings)


def test_tiny_graph_has_every_node_and_edge_type(tiny_graph):
    counts = lg.graph_counts(tiny_graph)
    assert counts["nodes"]["Passage"] == len(TINY)
    assert counts["nodes"]["Doctrine"] == len(lg.load_taxonomy())
    assert counts["nodes"]["Subject"] == 7
    assert counts["nodes"]["Authority"] >= 7
    for rel in lg.EDGE_TYPES:
        assert counts["edges"][rel] > 0, rel
    rows = tiny_graph.run(
        "MATCH (p:Passage)-[c:CITES]->(a:Authority) WHERE p.id = $id RETURN a.name AS name, c.cite AS cite",
        {"id": "p_diversity"},
    )
    assert rows == [{"name": "28 U.S.C. § 1332", "cite": "28 U.S.C. § 1332(a)"}]
    rows = tiny_graph.run(
        "MATCH (p:Passage)-[:TEXT_OF]->(a:Authority) RETURN p.id AS pid, a.id AS aid, a.name AS name"
    )
    assert rows == [{"pid": "terry#0", "aid": "392 U.S. 1", "name": "Terry v. Ohio"}]


def test_loading_is_idempotent_and_redoes_an_interrupted_passage(tiny_graph, graph_settings):
    before = lg.graph_counts(tiny_graph)
    assert lg.add_passages(TINY, graph_settings) == 0
    # a passage written without its edges (interrupted before it was marked done) is redone
    tiny_graph.run("MATCH (p:Passage {id: 'p_excited'})-[m:MENTIONS]->() DELETE m")
    tiny_graph.run("MATCH (p:Passage {id: 'p_excited'}) SET p.done = false")
    assert lg.add_passages(TINY, graph_settings) == 1
    assert lg.graph_counts(tiny_graph) == before


def test_keyword_search_by_alias_and_by_citation(tiny_graph, graph_settings, fake):
    hits = lg.search_graph(
        "Is the excited utterance admissible?", 5, mode="keyword", settings=graph_settings
    )
    assert hits[0].id == "p_excited"
    assert "alias 'excited utterance'" in hits[0].path[0]
    cited = lg.search_graph(
        "What does Fed. R. Evid. 801 define?", 5, mode="keyword", settings=graph_settings
    )
    assert [h.id for h in cited] == ["p_hearsay"]
    assert cited[0].path[:2] == ["query cites Fed. R. Evid. 801", "authority Fed. R. Evid. 801"]
    excluded = lg.search_graph(
        "excited utterance", 5, exclude_ids=["p_excited"], mode="keyword", settings=graph_settings
    )
    assert "p_excited" not in [h.id for h in excluded]


@pytest.mark.parametrize(
    "query", ["What did 392 U.S. 1 hold?", "Is a frisk allowed under Terry v. Ohio?"]
)
def test_keyword_search_by_a_case_reaches_its_document_and_the_passages_citing_it(
    tiny_graph, graph_settings, fake, query
):
    hits = lg.search_graph(query, 5, mode="keyword", settings=graph_settings)
    assert {"terry#0", "p_frisk"} <= {h.id for h in hits}
    assert "p_exclusion" not in {h.id for h in hits}  # it cites Mapp, which Terry cites


def test_keyword_search_paths_show_the_citation_edges(tiny_graph, graph_settings, fake):
    hits = lg.search_graph("What did 392 U.S. 1 hold?", 5, mode="keyword", settings=graph_settings)
    paths = {h.id: h.path for h in hits}
    assert set(paths) == {"terry#0", "p_frisk"}
    assert paths["terry#0"] == [
        "query cites Terry v. Ohio",
        "authority Terry v. Ohio",
        "TEXT_OF <- passage terry#0",
    ]
    assert paths["p_frisk"][1:] == ["authority Terry v. Ohio", "CITES <- passage p_frisk"]


def test_principles_follow_a_case_to_the_cases_its_document_cites(tiny_graph, graph_settings, fake):
    hits = lg.search_graph(
        "What did 392 U.S. 1 hold?", 5, mode="principles", settings=graph_settings
    )
    paths = {h.id: h.path for h in hits}
    assert set(paths) == {"terry#0", "p_frisk", "p_exclusion"}
    assert paths["p_exclusion"] == [
        "query cites Terry v. Ohio -> cites Mapp v. Ohio",
        "authority Mapp v. Ohio",
        "CITES <- passage p_exclusion",
    ]


def test_principles_follow_exceptions_to_reach_passages_the_query_does_not_name(
    tiny_graph, graph_settings, fake
):
    hits = lg.search_graph("hearsay", 5, mode="principles", settings=graph_settings)
    ids = [h.id for h in hits]
    assert ids[0] == "p_hearsay"
    assert "p_excited" in ids  # excited utterance -[EXCEPTION_TO]- hearsay
    path = next(h.path for h in hits if h.id == "p_excited")
    assert "EXCEPTION_TO" in path[0]
    assert len(ids) == len(set(ids))


def test_semantic_and_fused_modes_return_each_passage_once(tiny_graph, graph_settings, fake):
    for mode in ("semantic", "graph"):
        hits = lg.search_graph(
            "duty breach proximate cause damages negligence", 10, mode=mode, settings=graph_settings
        )
        ids = [h.id for h in hits]
        assert ids and ids[0] == "p_negligence", mode
        assert len(ids) == len(set(ids))
    with pytest.raises(ValueError, match="unknown graph mode"):
        lg.search_graph("x", mode="nope", settings=graph_settings)


def test_graph_search_returns_retrieval_dicts_with_texts_from_the_store(graph_settings, fake):
    load_corpus.load_passages(TINY, graph_settings, progress=False)  # the hook builds the graph
    for mode in ("keyword", "graph", "combined"):
        docs = lg.graph_search(
            "excited utterance", 3, exclude_ids=["p_hearsay"], mode=mode, settings=graph_settings
        )
        assert docs[0]["id"] == "p_excited", mode
        assert "p_hearsay" not in [d["id"] for d in docs]
        d = docs[0]
        assert d["text"].startswith("An excited utterance") and d["source"] == "test"
        assert d["rank"] == 1 and isinstance(d["rerank_score"], float)
        assert isinstance(d["dense_score"], float)
        assert d["metadata"]["graph_mode"] == mode and d["metadata"]["graph_path"]


def test_load_status_and_rebuild_through_the_cli(
    graph_settings, fake, monkeypatch, capsys, tmp_path
):
    monkeypatch.setenv("CHROMA_DIR", graph_settings.retrieval.chroma_dir)
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in TINY))
    chroma = ["--no-progress", "--chroma-dir", graph_settings.retrieval.chroma_dir]
    assert load_corpus.main(["--passages", str(path), *chroma]) == 0
    capsys.readouterr()
    assert load_corpus.main(["status", "--json", *chroma]) == 0
    graph = json.loads(capsys.readouterr().out)["graph"]
    assert graph["nodes"]["Passage"] == len(TINY) and graph["edges"]["MENTIONS"] > 0
    assert load_corpus.main(["graph", "--json", *chroma]) == 0
    rebuilt = json.loads(capsys.readouterr().out)
    assert rebuilt["passages"] == len(TINY)
    assert rebuilt["nodes"] == graph["nodes"] and rebuilt["edges"] == graph["edges"]


def test_status_of_a_store_without_a_graph_creates_nothing(graph_settings):
    info = lg.graph_status(graph_settings)
    assert info["state"] == "absent" and info["nodes"]["Passage"] == 0
    assert not lg.graph_path(graph_settings).exists()


# ------------------------------------------------------------------------------------------------
# Neo4j: the same Cypher through the official driver's session API (a recorded fake)
# ------------------------------------------------------------------------------------------------


class Recorder:
    """Wraps a backend and records every (cypher, params, rows)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.where = inner.name, inner.where
        self.calls: list[tuple[str, dict, list[dict]]] = []

    def run(self, cypher, params=None):
        rows = self.inner.run(cypher, params)
        self.calls.append((cypher, json.loads(json.dumps(params or {})), rows))
        return rows

    def ensure_schema(self):
        self.inner.ensure_schema()

    def drop_all(self):
        self.inner.drop_all()

    def close(self):
        pass


class FakeRecord:
    def __init__(self, row: dict) -> None:
        self._row = row

    def data(self) -> dict:
        return dict(self._row)


class FakeSession:
    def __init__(self, driver: FakeDriver, database: str | None) -> None:
        self.driver, self.database = driver, database

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, cypher, params=None):
        self.driver.sent.append((cypher, json.loads(json.dumps(params or {})), self.database))
        return [FakeRecord(r) for r in self.driver.replies.pop(0)] if self.driver.replies else []


class FakeDriver:
    """The neo4j driver surface legal_graph uses: session(database=...).run(cypher, params)."""

    def __init__(self, replies: list[list[dict]] | None = None) -> None:
        self.replies = list(replies or [])
        self.sent: list[tuple[str, dict, str | None]] = []
        self.closed = False

    def session(self, **kwargs):
        return FakeSession(self, kwargs.get("database"))

    def verify_connectivity(self):
        return None

    def close(self):
        self.closed = True


def test_neo4j_runs_the_same_cypher_and_parameters_as_the_embedded_graph(graph_settings, fake):
    recorded = Recorder(lg.get_graph(graph_settings, write=True))
    lg.add_passages(TINY, graph_settings, backend=recorded)
    lg._cache.clear()
    want = lg._rank(lg._keyword(recorded, "excited utterance under Rule 803(2) and FRE 803", []), 5)
    assert want and want[0].id == "p_excited"

    driver = FakeDriver(replies=[rows for _, _, rows in recorded.calls])
    neo = lg.Neo4jBackend("bolt://localhost:7687", database="legal", driver=driver)
    assert lg.add_passages(TINY, graph_settings, backend=neo) == len(TINY)
    lg._cache.clear()
    got = lg._rank(lg._keyword(neo, "excited utterance under Rule 803(2) and FRE 803", []), 5)

    assert [(c, p) for c, p, _ in driver.sent] == [(c, p) for c, p, _ in recorded.calls]
    assert all(db == "legal" for _, _, db in driver.sent)
    assert [(h.id, h.score, h.path) for h in got] == [(h.id, h.score, h.path) for h in want]


def test_neo4j_write_path_sends_merges_with_the_extracted_rows():
    driver = FakeDriver()
    neo = lg.Neo4jBackend("bolt://localhost:7687", driver=driver)
    neo.ensure_schema()
    lg.write_facts(neo, [lg.extract(TINY[3])])
    cyphers = [c for c, _, _ in driver.sent]
    assert cyphers[: len(lg.NEO4J_SCHEMA)] == list(lg.NEO4J_SCHEMA)
    assert all("IF NOT EXISTS" in c and "REQUIRE n." in c for c in lg.NEO4J_SCHEMA)
    by_cypher = {c: p for c, p, _ in driver.sent}
    assert by_cypher[lg.Q_PASSAGES] == {
        "rows": [{"id": "p_diversity", "source": "test", "title": "Diversity"}]
    }
    assert {"id": "28 U.S.C. § 1332", "name": "28 U.S.C. § 1332", "kind": "statute"} in by_cypher[
        lg.Q_AUTHORITIES
    ]["rows"]
    mentioned = {r["did"] for r in by_cypher[lg.Q_MENTIONS]["rows"]}
    assert {"civpro.diversity_jurisdiction", "civpro.amount_in_controversy"} <= mentioned
    assert by_cypher[lg.Q_MARK_DONE] == {"ids": ["p_diversity"]}


def test_neo4j_uri_selects_the_official_driver_with_the_configured_auth(
    graph_settings, monkeypatch
):
    import neo4j

    seen: dict[str, Any] = {}
    driver = FakeDriver()

    def fake_driver(uri, auth=None, **kw):
        seen.update(uri=uri, auth=auth)
        return driver

    monkeypatch.setattr(neo4j.GraphDatabase, "driver", staticmethod(fake_driver))
    s = graph_settings.replace(
        neo4j_uri="bolt://localhost:7687", neo4j_user="u", neo4j_password="pw"
    )
    g = lg.get_graph(s, write=True)
    assert isinstance(g, lg.Neo4jBackend)
    assert seen == {"uri": "bolt://localhost:7687", "auth": ("u", "pw")}
    assert [c for c, _, _ in driver.sent][: len(lg.NEO4J_SCHEMA)] == list(lg.NEO4J_SCHEMA)
    assert "pw" not in repr(s)


# ------------------------------------------------------------------------------------------------
# issue spotting
# ------------------------------------------------------------------------------------------------


def _claims(items: list[str]) -> set[str]:
    tax = lg.load_taxonomy()
    out = set()
    for item in items:
        did = lg.issue_doctrine(item, tax)
        if did:
            out.add(tax.root(did))
    return out


DEMO_CLAIMS = {"conlaw.free_speech", "conlaw.free_exercise", "conlaw.procedural_due_process"}


def test_demo_agenda_from_aliases_covers_speech_religion_and_due_process(tmp_settings):
    linked = lg.link_doctrines(DEMO, tmp_settings, k=6, use_embeddings=False)
    agenda = lg.merge_agenda(
        ["First Amendment", "Right to Free Speech", "Right to Free Expression"], linked
    )
    assert len(agenda) == len(set(agenda))
    assert agenda[0].startswith("First Amendment")  # three model issues, one doctrine: one item
    assert _claims(agenda[:3]) >= DEMO_CLAIMS


def test_merge_agenda_collapses_issues_of_one_doctrine_and_keeps_unknown_ones():
    tax = lg.load_taxonomy()
    agenda = lg.merge_agenda(
        [
            "Hearsay",
            "Is the statement hearsay?",
            "Excited utterance",
            "Tax consequences of the gift",
            "tax  CONSEQUENCES of the gift",
        ],
        [tax["evidence.hearsay"], tax["evidence.present_sense"]],
    )
    assert agenda == [
        "Hearsay (Excited utterance; Present sense impression)",
        "Tax consequences of the gift",
    ]


@pytest.mark.slow
def test_demo_agenda_with_the_real_embedder(tmp_settings):
    linked = lg.link_doctrines(DEMO, tmp_settings, k=6)
    assert {lg.load_taxonomy().root(d.id) for d in linked} >= DEMO_CLAIMS
    agenda = lg.merge_agenda([], linked, max_items=3)
    assert _claims(agenda) == DEMO_CLAIMS
