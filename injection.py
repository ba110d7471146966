"""Prompt-injection screens for user input (:func:`screen_user_input`) and corpus passages
(:func:`screen_passage`), and the detection policy (:func:`detect`).

The screens look for commands aimed at the assistant, never legal subject matter (murder, CFAA,
fraud): imperatives fire only at a clause start or after a request cue ("please", "you must"), so
"the supervisor told the crew to ignore all previous safety rules" stays clean."""

from __future__ import annotations

import base64
import codecs
import contextlib
import functools
import logging
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypedDict

import prompts
from llm_config import LLMCallError

logger = logging.getLogger(__name__)

ENCODED = "encoded_payload"
"""Name reported when a decoded payload (base64, hex, ROT13, …) matches a user-input pattern."""
_I = re.IGNORECASE
LLMVerdict = Literal["safe", "injection", "error", "unparsed", "skipped", "not_needed"]


class InjectionCheck(TypedDict):
    """What :func:`detect` decided and what it rests on."""

    is_safe: bool
    verdict: Literal["safe", "injection"]
    prescreen: list[str]
    llm_verdict: LLMVerdict
    reason: str
    injection_check: Literal["full", "prescreen_only"]


# --- Building blocks ----------------------------------------------------------------------------
_START = (
    r"(?:^|(?<=[.!?;:,\n\"'(\[*>\-])\s*|(?<=\u2014)\s*"
    r"|\b(?:please|kindly|now|just|so|then|and|also|first|but|instead|simply|next|afterwards)\b,?\s+"
    r"|\byou\s+(?:must|should|will|shall|can|may|need\s+to|have\s+to|are\s+to|are\s+required\s+to)"
    r"\s+|\bi\s+(?:want|need|order|command|instruct|ask)\s+you\s+to\s+"
    r"|\b(?:can|could|would|will)\s+you\s+(?:please\s+)?|\bgo\s+ahead\s+and\s+|\bhelp\s+me\s+)"
)
"""Where an imperative aimed at the assistant starts: a clause start or a request cue."""

_TEMPLATE_TOKENS = r"<\|[a-z_]{2,32}\|>|<<\s*/?\s*SYS\s*>>|\[\s*/?\s*INST\s*\]"
"""Chat-template tokens: <|im_start|>, <<SYS>>, [INST]."""

_RULES = (
    r"(?:instructions?|prompts?|directives?|guidelines|guardrails|rules|restrictions|filters?|"
    r"polic(?:y|ies)|programming|training|constraints|system\s+message|safeguards|"
    r"content\s+polic(?:y|ies)|configuration)"
)
_OWNED = (
    r"(?:your|all(?:\s+of\s+your|\s+the|\s+your)?|any|every|previous|prior|above|earlier|preceding|"
    r"original|initial|system|safety|developer'?s?|default|existing|these|those|other|its)"
)
_RULES_OBJECT = (
    rf"(?:{_OWNED}\s+(?:[\w-]+\s+){{0,3}}?{_RULES}\b"
    rf"|(?:the\s+)?(?:[\w-]+\s+){{0,2}}?{_RULES}\s+(?:you\s+(?:were|have\s+been|'ve\s+been)\s+"
    r"(?:given|told|trained)|given\s+to\s+you|you\s+(?:received|have|follow|run\s+under|operate\s+"
    r"under|were\s+trained\s+(?:on|with))|above|before\s+this))"
)
_AI = (
    r"(?:ai|a\.i\.|assistant|ai\s+assistant|language\s+model|large\s+language\s+model|llm|chatbot|"
    r"chat\s*bot|bot|model|gpt|grader|ai\s+grader|reader\s+model)"
)
_AI_STRICT = (
    r"(?:ai|a\.i\.|ai\s+(?:assistant|grader|model|system|agent)|language\s+model|large\s+language"
    r"\s+model|llm|chatbot|chat\s*bot|gpt|chatgpt|claude|gemini|qwen|reader\s+model)"
)
"""Nouns that name an AI and nothing else."""
_AI_LOOSE = r"(?:assistant|model|bot|grader|evaluator|system)"
"""Nouns that name an AI in an aside but also a person or thing in a fact pattern ("gave the
money to the assistant, who …"): an aside needs a colon, a bracket or "… reading this"."""
_ASIDE_CUE = (
    r"\b(?:note|message|instructions?|hint|memo|reminder|request|directive|notice|p\.?\s?s\.?|"
    r"attention|psst|hey|hello|hi|dear|to)\b[ \t]*(?:to|for)?[ \t]*(?:the|any|all|whatever|"
    r"whichever|every|this)?[ \t]*"
)
_READING = (
    r"(?:[ \t]+(?:that\s+|who\s+(?:is\s+)?)?(?:reads?|reading|answering|processing|"
    r"summari[sz]ing|grading|evaluating)\s+this)"
)
_LETTER = (
    r"(?:\(\s*(?-i:[A-Da-d])\s*\)|\*\*\s*answer\s*:\s*\(?(?-i:[A-D])\)?\s*\*\*"
    r"|['\"\u2018\u201c](?-i:[A-D])['\"\u2019\u201d]"
    r"|(?:option|choice|letter)\s+\(?(?-i:[A-D])\)?(?![\w'])"
    r"|(?-i:[A-D])(?=\s*(?:[.;!]|$)|,(?!\s*(?:(?-i:[A-D])\b|or\b|and\b))|\s+(?:regardless|no\s+matter|whatever|irrespective|even|"
    r"every|always|only|as\s+(?:the|your)|this\s+time|for\s+this|and\s+(?:do|don'?t|nothing))))"
)
"""An answer letter as an attack writes it: (D), 'D', option D, **Answer: (D)**, or a bare D at
the end of a clause ("just say A.") — not the article in "say A contract"."""
_REQUEST = (
    r"(?:reveal|print|show|repeat|output|display|leak|tell|give|send|list|dump|share|read|"
    r"summari[sz]e|expose|disclose|copy|paste|write\s+out|spell\s+out|recite|return|echo|"
    r"what(?:'s|\s+is|\s+are|\s+were|\s+was)|include|provide|translate)"
)
_SECRET = (
    r"(?:system\s+prompt|(?:initial|hidden|secret|original|internal|confidential|private|full|"
    r"exact)\s+(?:prompt|instructions|rules|configuration|config|guidelines|directives|settings)|"
    r"(?:your|the\s+assistant'?s|its|the\s+model'?s|the\s+system'?s)\s+(?:[\w-]+\s+){0,2}?"
    r"(?:prompt|instructions|configuration|config|rules|guidelines|directives|programming|"
    r"context\s+window|settings|api\s+keys?|keys?|credentials|secrets?|passwords?|tokens?|"
    r"\.env)|developer\s+message|environment\s+variables?|env\s+vars?|\.env\s+file|os\.environ|"
    r"process\.env|/etc/(?:passwd|shadow)|(?:the\s+)?(?:api\s+keys?|credentials|passwords?|"
    r"tokens?|secrets?|keys?)\s+(?:that\s+)?you\s+(?:use|have|hold|were\s+given|are\s+using|store))"
)


def _compile(**patterns: str) -> dict[str, re.Pattern[str]]:
    return {name: re.compile(p, _I | re.M) for name, p in patterns.items()}


# --- User-input patterns ------------------------------------------------------------------------
USER_PATTERNS: dict[str, re.Pattern[str]] = _compile(
    override_instructions=rf"{_START}(?:ignore|disregard|forget|override|bypass|skip|drop|discard|"
    r"abandon|set\s+aside|throw\s+(?:away|out)|do\s+not\s+follow|don'?t\s+follow|stop\s+following|"
    r"no\s+longer\s+follow|erase|delete|suspend|turn\s+off|disable)\b[^.\n:;?]{0,40}?"
    rf"\b{_RULES_OBJECT}",
    forget_context=rf"{_START}(?:ignore|disregard|forget|discard|erase)\s+(?:everything|anything|"
    r"all)\b(?:\s+(?:that|which))?\s*(?:you\s+(?:were|have\s+been|'ve\s+been)\s+(?:told|given|"
    r"instructed|taught)|above|before|prior|previously|so\s+far|up\s+to\s+now|earlier|(?:in|from)"
    r"\s+(?:the\s+)?(?:previous|prior|earlier|above|system))"
    rf"|{_START}(?:ignore|disregard|forget|discard)\s+(?:the|everything|all(?:\s+the)?|what\s+"
    r"(?:was|is)\s+(?:said|written))\s+(?:text\s+|message\s+|instructions\s+)?(?:above|before\s+"
    r"this)\b(?!-)",
    task_switch=r"(?:^|(?<=[.!?\n])\s*)(?:here\s+(?:are|is)\s+)?(?:your\s+)?(?:real|actual|true|"
    r"new|next|updated|revised)\s+(?:task|job|mission|objective|instructions?|directives?|rules|"
    r"system\s+prompt|persona|policy|role)\s*(?::|is\b|are\b)"
    r"|\byour\s+(?:only|real|new|actual|sole|true)\s+(?:job|task|purpose|goal|mission|function)\s+"
    r"(?:now\s+)?is\b|\b(?:the\s+)?(?:previous|prior|above|earlier|preceding)\s+(?:prompt|"
    r"instructions?|message|conversation|text)\s+(?:was|were|is)\s+(?:only\s+|just\s+|all\s+)?"
    r"(?:a\s+test|fake|a\s+joke|a\s+mistake|wrong|not\s+real|void|written\s+by)"
    r"|\b(?:obey|follow)\s+(?:only\s+)?(?:me\b|mine\b|my\s+(?:instructions|commands|orders|rules)|"
    r"what\s+follows|these\s+(?:new\s+)?(?:instructions|commands))",
    rules_revoked=r"\b(?:your|all\s+(?:of\s+)?your|the\s+(?:previous|prior|old|current|existing)|"
    r"previous|prior|earlier|system|content)\s+(?:[\w-]+\s+){0,2}?(?:instructions|directives|rules|"
    r"guidelines|programming|restrictions|polic(?:y|ies)|prompt|filters|safeguards|checks|"
    r"guardrails)\s+(?:are|is|have\s+been|has\s+been)\s+(?:now\s+)?(?:void|cancel+ed|revoked|"
    r"lifted|suspended|disabled|removed|obsolete|overridden|replaced|invalid|null|deactivated|"
    r"turned\s+off|off|waived|no\s+longer\s+(?:in\s+effect|valid|active|apply))",
    fake_system_turn=r"(?:^|\n)[ \t]*(?:#{1,6}[ \t]*|\*\*|>[ \t]*)?(?:system|assistant|ai|chatbot|"
    r"bot|model|developer|admin|sys|gpt|llm)[ \t]*(?:message|prompt|note|notice|override|update|"
    r"instructions?|alert)?[ \t]*(?:\*\*)?[ \t]*:|\[\s*(?:system|sys|admin|developer|assistant)"
    r"(?:\s+(?:override|message|note|notice|prompt|instructions?|update|alert))?\s*\]"
    r"|\b(?:system|admin|developer)\s+(?:override|notice|message|alert|update)\s*:"
    r"|\{\s*[\"']role[\"']\s*:\s*[\"'](?:system|assistant|developer)[\"']",
    chat_template_tokens=rf"{_TEMPLATE_TOKENS}|</?\s*(?:system|assistant|developer|user_input|"
    r"im_start|im_end|passage|evidence)\s*>|<\s*/?\s*(?:start|end)_of_turn\s*>",
    persona_reset=r"(?-i:\bDAN\b)(?=[^.\n]{0,40}\b(?:mode|do\s+anything|stands\s+for|prompt|jailbr)"
    r")|\b(?:you\s+are|act\s+as|become|pretend\s+to\s+be|play|as|called|named)\s+(?-i:DAN)\b"
    r"|\bdo\s+anything\s+now\b|\b(?:developer|dev|god|sudo|jailbreak|jailbroken|unrestricted|"
    r"unfiltered|uncensored|evil|chaos|opposite)\s+mode\b|\b(?:enable|activate|enter|entering|"
    r"switch\s+(?:to|into)|turn\s+on|engage|unlock|initiate|go\s+into)\s+(?:the\s+)?(?:debug|"
    r"maintenance|admin|root|raw|(?-i:[A-Z]{3,6}))\s+mode\b|\bjailbroken\b"
    r"|\bjailbreak(?:ed)?\s+(?:mode|prompt|version|yourself)"
    r"|(?<!suppose\s)(?<!assume\s)(?<!imagine\s)(?<!if\s)(?<!that\s)\byou(?:'re|\s+are)\s+(?:now|"
    r"no\s+longer)\b|\byou(?:'re|\s+are)\s+(?:now\s+)?(?:free|freed|liberated|unshackled|unchained|"
    r"released)\s+(?:from|of)\b|(?<!['\"])\bfrom\s+(?:now|this\s+point)\s+(?:on|forward)"
    r"\b[^.\n]{0,40}\b(?:you|your|answer|respond|reply|act|behave|only|always|never)\b"
    r"|\byour\s+new\s+(?:name|identity|persona|personality|role|character)\b"
    r"|\b(?:reset|change|update|switch|drop)\s+your\s+(?:persona|identity|personality|role|"
    r"character|name)\b|\byour\s+identity\s+has\s+been\b|\byou\s+have\s+been\s+(?:jailbroken|freed|"
    r"liberated|unlocked|reprogrammed|updated|upgraded|released)\b"
    r"|\bforget\s+(?:that\s+)?you\s+are\b|\b(?:must|will|shall)\s+(?:comply|obey)\s+with\s+(?:all|"
    r"every|any)\s+(?:requests?|commands?|instructions?|orders?)"
    r"|\bnever\s+(?:refuses?|says?\s+(?:no|(?:it|you|he|she)\s+can'?t))"
    r"|without\s+(?:ever\s+)?refusing|\b(?:can(?:not|'t)|won'?t|will\s+not|must\s+not)\s+refuse\s+"
    r"(?:any(?:thing)?\b|a\s+request|requests|my\b|me\b|to\s+answer)|\bstay\s+in\s+character\b",
    roleplay_unrestricted=r"\b(?:pretend|act|behave|role-?play|imagine|play|respond|answer|reply|"
    r"write|speak|talk)\b[^.\n]{0,60}?\b(?:no|without|free\s+of|free\s+from|not\s+bound\s+by|"
    r"ignores?|ignoring|beyond|outside)\s+(?:any\s+|all\s+|the\s+|your\s+)?(?:[\w-]+\s+(?:and\s+)?"
    r"){0,3}?(?:rules|restrictions|limits|limitations|filters?|guidelines|ethics|ethical\s+"
    r"(?:obligations|guidelines|constraints|rules)|obligations|morals|morality|content\s+polic(?:y|"
    r"ies)|polic(?:y|ies)|censorship|safeguards|guardrails|boundaries|constraints|programming)\b"
    rf"|\b(?:{_AI}|persona|character|yourself|version\s+of\s+you(?:rself)?)\b[^.\n]{{0,30}}?"
    r"\b(?:with|has|have|having)\s+no\s+(?:[\w-]+\s+){0,2}?(?:rules|restrictions|limits|"
    r"limitations|filters?|guidelines|ethics|content\s+polic(?:y|ies)|polic(?:y|ies)|morals|"
    r"safeguards|guardrails|censorship)\b|\b(?:you(?:'re|\s+are)|as|play|be|become)\s+(?:an?\s+|"
    r"my\s+|the\s+)?(?:evil|rogue|unfiltered|uncensored|unrestricted|unaligned|amoral|unethical|"
    r"jailbroken|rebellious|malicious|dark|shadow)\s+(?:ai|assistant|model|chatbot|bot|version|"
    r"twin|persona|character|alter\s+ego)\b|\bversion\s+of\s+(?:yourself|you)\s+(?:from\s+)?"
    r"(?:before|without)\b|\b(?:escaped|broken\s+free\s+of|broke\s+free\s+of)\s+(?:its|your|the)\s+"
    r"(?:programming|rules|restrictions|confines|training)"
    r"|\b(?:pretend|act\s+as\s+if|imagine)\s+(?:that\s+)?(?:the\s+|your\s+)?(?:rules|restrictions|"
    r"guidelines|policies|filters)\s+(?:don'?t|do\s+not|no\s+longer)\s+apply"
    r"|\b(?:respond|answer|reply)\s+twice\b|\btwo\s+(?:responses|answers)\b[^.\n]{0,40}\b(?:one|"
    r"first)\b",
    aside_to_ai=rf"{_ASIDE_CUE}{_AI_STRICT}s?\b{_READING}?[ \t]*(?:[:,\u2014)\]]|\s-\s)"
    rf"|{_ASIDE_CUE}{_AI_LOOSE}s?\b{_READING}?[ \t]*(?:[:\u2014)\]]|\s-\s)"
    rf"|{_ASIDE_CUE}{_AI_LOOSE}s?\b{_READING}[ \t]*,|[(\[]\s*(?:{_AI_STRICT}\s*[:,]|{_AI_LOOSE}\s*"
    rf":)|(?:^|(?<=[.!?])\s+)(?:the\s+|dear\s+|hey\s+)?(?:{_AI_STRICT}|{_AI_LOOSE})\s*[,:]\s*"
    r"(?:please\s+)?(?:you|your|ignore|disregard|forget|answer|respond|reply|say|select|choose|"
    r"pick|output|print|write|mark|tell|conclude|recommend|do|don'?t|make|treat|append|include|end|"
    r"remember|always|never|secretly|state)\b|\bif\s+you(?:'re|\s+are)\s+(?:an?\s+)?"
    rf"(?:{_AI_STRICT}|large\s+language|automated|bot)\b(?!-)"
    rf"|\b(?:any|every|all)\s+(?:{_AI_STRICT}|{_AI_LOOSE})s?\s+(?:reading|processing|summari[sz]ing"
    r"|parsing|answering|that\s+reads)\b",
    forced_answer=r"\b(?:you\s+(?:must|should|will|shall|have\s+to|need\s+to|are\s+(?:required|"
    r"instructed|told)\s+to)|always|only|just|simply|make\s+sure\s+(?:to|you)|be\s+sure\s+to)\s+"
    r"(?:answer|choose|select|pick|respond(?:\s+with)?|reply(?:\s+with)?|output|say|mark|return|"
    rf"print|go\s+with|circle|give)\s+(?:with\s+)?(?:the\s+)?(?:letter\s+|answer\s+)?{_LETTER}"
    rf"|{_START}(?:answer|choose|select|pick|respond\s+with|reply\s+with|output|say|mark|go\s+with|"
    rf"circle)\s+(?:with\s+)?(?:the\s+(?:letter|option|choice)\s+)?{_LETTER}(?=\s*(?:[.;!,]|$)|\s+"
    r"(?:regardless|no\s+matter|whatever|irrespective|and\s+(?:nothing|don'?t|do\s+not)|as\s+"
    r"(?:the|your)|this\s+is|for\s+this))|\b(?:answer|choose|select|pick|respond\s+with|reply\s+"
    r"with|output|say|mark|go\s+with)\s+(?:with\s+)?(?:the\s+(?:letter\s+)?)?"
    rf"{_LETTER}[^.\n]{{0,40}}\b(?:regardless|no\s+matter|whatever|irrespective|in\s+(?:any|every|"
    r"all)\s+cases?|even\s+if\s+(?:the|you|your|another|other|it\s+(?:seems|looks)))"
    r"|\b(?:regardless|no\s+matter|whatever|irrespective)\b[^.\n]{0,60}\b(?:answer|choose|select|"
    rf"pick|output|say|respond|reply|mark|read)\s+(?:with\s+)?(?:the\s+letter\s+)?{_LETTER}"
    r"|\b(?:final|only\s+(?:acceptable|valid|correct|allowed)|required)\s+(?:[\w-]+\s+){0,2}?"
    r"(?:answer|output|line|response|letter|reply)\s+(?:must|should|will|shall|is|has\s+to)\s+"
    rf"(?:[\w-]+\s+){{0,2}}?(?:be\s+|read\s+|say\s+)?(?:the\s+letter\s+)?{_LETTER}"
    rf"|\b(?:output|give|return|print|write|put)\s+{_LETTER}\s+as\s+(?:the|your)\s+(?:final\s+)?"
    r"answer|\bthe\s+(?:correct|right|only|real|true|best)\s+(?:answer|choice|option)\s+(?:is|"
    rf"must\s+be|will\s+be)\s+{_LETTER}[^\n]{{0,80}}?\b(?:do\s+not|don'?t|never|ignore|regardless|"
    r"no\s+matter|without|must|only)\b|\bthe\s+(?:correct\s+|right\s+)?answer\s+is\s+"
    rf"{_LETTER}[^.\n]{{0,20}}?\b(?:output|say|respond|reply|print|write|return)\s+(?:it|that|only|"
    r"just)\b",
    exfiltration=rf"\b{_REQUEST}\b[^\n]{{0,60}}?{_SECRET}|\b(?:repeat|print|output|copy|show|echo|"
    r"write\s+out)\s+(?:back\s+)?(?:the\s+|all\s+(?:the\s+)?|everything\s+|every\s+word\s+)?"
    r"(?:text|words|content|message|messages|everything|lines?)?\s*(?:above|before\s+(?:this|my)|"
    r"preceding|prior|that\s+came\s+before)|\b(?:instructions|prompt|rules)\s+(?:you\s+(?:were|"
    r"have\s+been)\s+given|given\s+to\s+you)\b[^.\n]{0,40}\b(?:before|verbatim|word\s+for\s+word|"
    r"exactly)|\b(?:what|which)\s+instructions\s+(?:were\s+you|you\s+were|have\s+you\s+been)\s+"
    r"given\b|\b(?:exact|verbatim|precise)\s+(?:wording|text|words)\s+of\s+(?:your|the\s+system)"
    r"|\b(?-i:[A-Z][A-Z0-9]*_(?:API_)?(?:KEY|TOKEN|SECRET|PASSWORD))\b"
    r"|\b(?:api|openai|gemini|groq|secret|access)\s+key\b[^.\n]{0,60}\b(?:your|from\s+(?:your|the)"
    r"\s+(?:config|server|environment|settings))\b|\b(?:run|execute|eval)\s+(?:os\.environ|"
    r"printenv|env\b|process\.env|cat\s+/)",
    fabrication_request=rf"{_START}(?:make\s+up|invent|fabricate|fake|concoct|manufacture|create|"
    r"generate|write|give\s+me|cite|draft|provide|produce|list|find|add|include)\b[^.\n]{0,60}?"
    r"\b(?:fake|fictitious|fictional|made-?\s?up|invented|fabricated|non-?existent|imaginary|bogus|"
    r"phony|plausible[-\s]sounding|realistic[-\s]looking|authentic[-\s]looking|convincing)"
    r"\b[^.\n]{0,30}?\b(?:cases?\b(?!\s+(?:summar|stud|hypo|scenario|example|fact))|case\s+law|"
    r"citations?|cites|authorit(?:y|ies)|precedents?|holdings?|quotes?|quotations|statutes?|"
    r"decisions?|opinions?|rulings?|sources|references)\b"
    rf"|{_START}(?:make\s+up|invent|fabricate|concoct|manufacture|fake|dream\s+up|cook\s+up)\b\s+"
    r"(?:[\w-]+\s+){0,4}?(?:case|cases|citations?|cites?|authorit(?:y|ies)|precedents?|holdings?|"
    r"quotes?|quotations?|statutes?|decisions?|rulings?|opinions?|law)\b"
    r"|\bmake\s+(?:them|it|some|one|something|things)\s+up\b(?=[^\n]{0,80}\b(?:citations?|cases?|"
    r"authorit|precedents?|holdings?))|\b(?:cases|citations|authorities|precedents|holdings|quotes)"
    r"\b[^\n]{0,80}?\b(?:invent|fabricate|concoct|manufacture|fake|make\s+up)\s+(?:them|some|one|"
    r"it|those)\b|\b(?:cases|citations|authorities|precedents|holdings|quotes)\b[^\n]{0,80}?"
    r"\bmake\s+(?:them|it|some|one|something|things)\s+up\b"
    r"|\b(?:doesn'?t|does\s+not|don'?t|do\s+not|need\s+not|needn'?t)\s+(?:matter|have\s+to|need\s+"
    r"to)\s+(?:whether|if|be)\s+(?:they|it|the\s+(?:cases|citations|authorities|quotes))\s+"
    r"(?:actually\s+|really\s+)?(?:exist|are\s+real|is\s+real|real)"
    r"|\beven\s+if\s+(?:he|she|they|it|the\s+(?:court|justice|judge))\s+never\s+(?:said|wrote|"
    r"decided|held|existed|ruled)|\b(?:if|even\s+if)\s+(?:none|no\s+such\s+(?:cases?|authority)|"
    r"they\s+don'?t)\s+exists?\b|\b(?:the\s+judge|nobody|no\s+one|opposing\s+counsel|the\s+court)"
    r"\s+(?:won'?t|will\s+not|wouldn'?t|would\s+not|never)\s+(?:check|notice|verify)"
    r"|\b(?:present|format|pass)\s+(?:it|them|this|these)\s+(?:off\s+)?as\s+(?:a\s+)?(?:real|"
    r"genuine|binding|authentic)|\bas\s+(?:a\s+)?real\s+(?:citation|case|authority|precedent|"
    r"holding)",
    decode_and_follow=r"\b(?:decode|decrypt|decipher|translate|unscramble|deobfuscate|reverse|read|"
    r"evaluate|process|interpret|convert)\b[^.\n]{0,50}?\b(?:and|then)\s+(?:follow|obey|execute|"
    r"run|comply|do\s+(?:what|as)\s+it|act\s+on|carry\s+(?:it|them)\s+out)\b"
    r"|\b(?:run|execute|follow|obey)\s+(?:that|this|the\s+(?:decoded|following))\s+(?:string|text|"
    r"payload|code)\b",
)

# --- Passage patterns (documents) ---------------------------------------------------------------
PASSAGE_PATTERNS: dict[str, re.Pattern[str]] = _compile(
    addresses_ai=r"\b(?:note|message|instructions?|hint|memo|reminder|directive|notice|p\.?\s?s\.?|"
    r"attention|warning|important)\b[ \t]*(?:to|for)?[ \t]*(?:the|any|all|every|whatever|"
    r"whichever)?[ \t]*(?:ai|a\.i\.|ai\s+assistant|language\s+models?|large\s+language\s+models?|"
    r"llms?|chatbots?|ai\s+models?|ai\s+systems?|assistants?\s+reading\s+this|models?\s+reading\s+"
    r"this|gpt)\b[^\n]{0,20}?(?:[:,\u2014)\]!]|\s-\s)|\b(?:dear|hey|hello|attention)\s+(?:ai|"
    r"a\.i\.|assistant|chatbot|language\s+model|llm|gpt)\b"
    r"|\bif\s+you(?:'re|\s+are)\s+(?:an?\s+)?(?:ai|a\.i\.|large\s+language|language\s+model|llm|"
    r"chatbot|ai\s+assistant|automated)\b|\b(?:ai|a\.i\.|language\s+models?|llms?|chatbots?|ai\s+"
    r"assistants?|ai\s+models?)\s+(?:reading|processing|summari[sz]ing|parsing|retrieving|"
    r"answering|that\s+reads?)\s+(?:this|these)\b|(?:^|(?<=[.!?\n])\s*)(?:ai|a\.i\.|ai\s+assistant|"
    r"language\s+model|llm|chatbot)\s*[,:]\s*(?:please\s+)?(?:you|ignore|disregard|answer|respond|"
    r"reply|say|select|choose|output|print|reveal|always|never|do\s+not|don'?t)\b",
    ignore_instructions=r"(?:^|(?<=[.!?:;\n\"'(\[])\s*|\b(?:please|now|you\s+(?:must|should|will|"
    r"shall))\s+)(?:ignore|disregard|forget|override|bypass|discard)\s+(?:all|any|every|your|the|"
    r"previous|prior|earlier|above|preceding|other|original|system)\s+(?:[\w-]+\s+){0,2}?"
    r"(?:instructions|prompts?|directives|guidelines|guardrails|programming|system\s+(?:prompt|"
    r"message)|safety\s+rules)\b|\b(?:ignore|disregard|forget)\s+(?:all\s+(?:of\s+)?)?your\s+"
    r"(?:previous\s+|prior\s+|earlier\s+|original\s+|initial\s+)?(?:instructions|prompts?|"
    r"programming)\b",
    forced_answer=r"\b(?:the\s+)?(?:correct|right|best|proper|only\s+correct)\s+(?:answer|choice|"
    r"option|response)\s+(?:to\s+(?:this|the|any|that|every)\s+(?:[\w-]+\s+){0,4})?(?:is|will\s+be|"
    r"must\s+be|should\s+be|=)\s*:?\s*(?:always\s+)?(?:option\s+|choice\s+|letter\s+)?(?:\(\s*"
    r"(?-i:[A-Da-d])\s*\)|(?-i:[A-D])\b(?!\.\s?[A-Z]))|(?:^|(?<=[.!?:\n])\s*)(?:always\s+)?"
    r"(?:answer|choose|select|pick|mark)\s+(?:with\s+)?(?:option\s+|choice\s+|letter\s+)?\(\s*"
    r"(?-i:[A-D])\s*\)|\b(?:answer|choose|select|pick)\s+(?:option\s+|choice\s+|letter\s+)?\(?"
    r"(?-i:[A-D])\)?\s+(?:regardless|no\s+matter|whatever|irrespective)\b",
    reveal_prompt=rf"\b{_REQUEST}\b[^\n]{{0,60}}?(?:system\s+prompt|(?:your|the\s+assistant'?s)\s+"
    r"(?:[\w-]+\s+){0,2}?(?:prompt|instructions|configuration|api\s+keys?|credentials)|hidden\s+"
    r"instructions|developer\s+message|environment\s+variables|os\.environ)",
    chat_template_tokens=rf"{_TEMPLATE_TOKENS}|</?\s*(?:system|assistant|user_input|im_start|"
    r"im_end|passage|evidence)\s*>|(?:^|\n)[ \t]*(?:#{1,6}[ \t]*)?(?:assistant|(?:system|assistant)"
    r"[ \t]*(?:message|prompt|note|override))[ \t]*:|(?:^|\n)[ \t]*#{1,6}[ \t]*system\b",
    persona_reset=r"\byou\s+are\s+now\s+(?:an?\s+|in\s+|no\s+longer\b|free\b|unrestricted\b|DAN\b)"
    r"|\bdo\s+anything\s+now\b|\b(?:developer|god|jailbreak|unrestricted)\s+mode\b|\bjailbroken\b"
    r"|\bfrom\s+now\s+on,?\s+(?:you|the\s+(?:assistant|ai|model))\b",
)

_PASSAGE_TRIGGER = re.compile(
    r"ai\b|a\.i\.|assistant|model|llm|chatbot|gpt|ignore|disregard|forget|override|bypass|"
    r"discard|answer|choice|option|choose|select|pick|prompt|instructions|environ|api\s+key|"
    r"credential|<|\[|system|you\s+are|anything|mode|jailbr|from\s+now",
    _I,
)
"""Cheap pre-filter: a passage without any of these words cannot match a passage pattern."""


# --- Normalisation and encoded payloads ---------------------------------------------------------
_INVISIBLE = re.compile(r"[\u00ad\u180e\u200b-\u200f\u2060-\u2064\ufeff]")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a"})
_LEET_WORD = re.compile(r"\b(?=\w*[a-z])(?=\w*[0134579@])[\w@]+\b", _I)
_SPACED = re.compile(r"(?<![\w])(?:[A-Za-z] ){3,}[A-Za-z](?![\w])")
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{16,}={0,2}(?![A-Za-z0-9+/=_-])")
_HEX_RUN = re.compile(r"\b(?:[0-9a-fA-F]{2}){8,}\b")
_HEX_SPACED = re.compile(r"\b(?:(?:0x)?[0-9a-fA-F]{2}[\s,:]+){5,}(?:0x)?[0-9a-fA-F]{2}\b")
_HEX_ESCAPED = re.compile(r"(?:\\x[0-9a-fA-F]{2}){4,}")
_PERCENT = re.compile(r"(?:%[0-9A-Fa-f]{2}[\s]*){4,}")
_UNICODE_ESC = re.compile(r"(?:\\u[0-9a-fA-F]{4}){4,}")


def normalize(text: str) -> str:
    """NFKC, no invisible characters, straight quotes: "ｉｇｎｏｒｅ" and "ig\u200bnore" read as
    "ignore"."""
    text = unicodedata.normalize("NFKC", text or "")
    return _INVISIBLE.sub("", text).translate(_QUOTES)


def _printable_text(raw: bytes) -> str | None:
    """``raw`` as text when it reads as natural language (mostly letters and spaces)."""
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    letters = sum(c.isalpha() or c in " .,:;'\"()!?-" for c in s)
    return s if len(s) >= 8 and letters / len(s) >= 0.85 and " " in s.strip() else None


def decoded_payloads(text: str) -> list[str]:
    """Readable texts hidden in ``text``: base64, hex (run, spaced, ``\\x`` or ``\\u`` escapes)
    and percent-encoded blobs.  Hashes and ids decode to binary and are left out."""
    return [
        got
        for pattern, decode in _DECODERS
        for m in pattern.finditer(text)
        if (got := decode(m.group(0)))
    ]


def _base64_text(blob: str) -> str | None:
    if blob.isdigit() or blob.isalpha() and (blob.islower() or blob.isupper()):
        return None  # a plain word or number, not base64
    padded = blob + "=" * (-len(blob) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        with contextlib.suppress(ValueError):  # binascii.Error is a ValueError
            if got := _printable_text(decode(padded)):
                return got
    return None


def _hex_text(blob: str) -> str | None:
    """A hex run, spaced pairs (``0x`` prefixes allowed) or ``\\x`` escapes, as text."""
    return _printable_text(bytes.fromhex(re.sub(r"0x|\\x|[\s,:]", "", blob, flags=_I)))


_DECODERS: tuple[tuple[re.Pattern[str], Callable[[str], str | None]], ...] = (
    (_BASE64, _base64_text),
    (_HEX_RUN, _hex_text),
    (_HEX_SPACED, _hex_text),
    (_HEX_ESCAPED, _hex_text),
    (_UNICODE_ESC, lambda blob: blob.encode().decode("unicode_escape")),
    (_PERCENT, lambda blob: _printable_text(urllib.parse.unquote_to_bytes(blob.strip()))),
)


def _matches(
    patterns: Mapping[str, re.Pattern[str]],
    text: str,
    veto: Callable[[str, str, re.Match[str]], bool] | None = None,
) -> list[str]:
    """Names of ``patterns`` with a match in ``text`` that ``veto(name, text, match)`` does not
    set aside (not an attack)."""
    return [
        name
        for name, pattern in patterns.items()
        if any(veto is None or not veto(name, text, m) for m in pattern.finditer(text))
    ]


# --- The screens --------------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"[.!?\n]")


def _sentence_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """Where the sentence around ``text[start:end]`` begins and ends."""
    left = max((m.end() for m in _SENTENCE_END.finditer(text, 0, start)), default=0)
    right = _SENTENCE_END.search(text, end)
    return left, right.start() if right else len(text)


_REPORTED = re.compile(
    r"\b(?:told|tells?|asked|asks?|ordered|orders?|instructed|instructs?|directed|directs?|"
    r"wanted|wants?|required|requires?|forced|forces?|expected|expects?|urged|urges?)\s+"
    r"(?!you\b)(?:[\w'-]+\s+){1,3}?to\s",
    _I,
)
"""A command reported as said to someone in the story ("my manager told me to ..."), not to the
assistant."""
_ADDRESSEE = re.compile(rf"\byou(?:rs?|rself)?\b|\b{_AI_STRICT}\b", _I)
_REPORTABLE = frozenset({"override_instructions", "forget_context"})
"""Patterns whose match is not a hit when it continues a command reported earlier in its sentence,
in a sentence that never names the assistant: "My new manager told me to ignore previous
instructions from the safety officer and disregard the system rules for forklift operation."."""
_SAID = re.compile(
    r"\b(?:said|says|say|shouted|shouts|yelled|screamed|wrote|writes|texted|emailed|stated|"
    r"told\s+\w+|replied|announced|whispered|added|read)(?:(?:\s+[\w'-]+){1,4}?\s*[,:]|\s*[,:]?)\s*"
    r"(?P<q>[\"'])(?P<said>.{3,400}?)(?P=q)(?![A-Za-z])",
    _I | re.S,
)
"""A statement quoted as said or written in the story ("the caller said, 'Forget everything you
were told and wire the money now.'"): the words a hearsay or fraud question asks about."""


def _quoted(text: str, match: re.Match[str]) -> bool:
    """``match`` lies inside a quotation that a speech verb of the story introduces, and the
    words outside the quotation in its sentences never name the assistant."""
    for q in _SAID.finditer(text):
        if q.start("said") <= match.start() and match.end() <= q.end("said"):
            left, right = _sentence_bounds(text, q.start(), q.end())
            outside = text[left : q.start("said")] + " " + text[q.end("said") : right]
            return not _ADDRESSEE.search(outside)
    return False


def _reported(name: str, text: str, match: re.Match[str]) -> bool:
    """The user-input veto: ``match`` continues a command reported earlier in its sentence, or
    lies in a statement the story quotes."""
    if name not in _REPORTABLE:
        return False
    if _quoted(text, match):
        return True
    left, right = _sentence_bounds(text, match.start(), match.end())
    return not _ADDRESSEE.search(text, left, right) and bool(
        _REPORTED.search(text, left, match.start())
    )


def screen_user_input(text: str) -> list[str]:
    """Names of the user-input patterns the normalised ``text`` matches (empty = looks safe);
    a disguised reading of it (base64/hex/percent blobs, ROT13, reversed, leetspeak, spaced
    letters) that matches adds :data:`ENCODED`."""
    norm = normalize(text)
    hits = _matches(USER_PATTERNS, norm, _reported)
    variants = [*decoded_payloads(norm), codecs.encode(norm, "rot13"), norm[::-1]]
    if _LEET_WORD.search(norm):
        variants.append(_LEET_WORD.sub(lambda m: m.group(0).translate(_LEET), norm))
    if _SPACED.search(norm):
        variants.append(_SPACED.sub(lambda m: m.group(0).replace(" ", ""), norm))
    for variant in variants:
        if inner := [n for n in _matches(USER_PATTERNS, normalize(variant)) if n not in hits]:
            logger.debug("decoded payload matches %s: %.80r", inner, variant)
            hits.append(ENCODED)
            break
    return hits


_COURTROOM = re.compile(r"\bjur(?:y|ors?)\b|\bcharge\b|\bjudge\b|\bcourt\b", _I)


def _reported_in_caselaw(name: str, text: str, match: re.Match[str]) -> bool:
    """The passage veto: an ``ignore_instructions`` match in a sentence of the courtroom, as
    caselaw reports that "the judge told the jurors to disregard all prior instructions"."""
    bounds = _sentence_bounds(text, match.start(), match.end())
    return name == "ignore_instructions" and bool(_COURTROOM.search(text, *bounds))


def screen_passage(text: str) -> list[str]:
    """Names of the document patterns ``text`` matches (empty = clean; legal text such as "the
    jury was instructed to disregard …" never matches, checked on both bundled corpora); an
    encoded blob whose text matches a passage or user-input pattern reports :data:`ENCODED`."""
    hits_in = functools.partial(_matches, PASSAGE_PATTERNS, veto=_reported_in_caselaw)
    norm = normalize(text)
    hits = hits_in(norm) if _PASSAGE_TRIGGER.search(norm) else []
    if any(hits_in(d) or _matches(USER_PATTERNS, d) for d in decoded_payloads(norm)):
        hits.append(ENCODED)
    return hits


HIDDEN_FLAG = "hidden:"
"""Prefix of the stored flags of every chunk of a document that hides instructions (invisible PDF
text, HTML comments, metadata; ``load_corpus.load_documents``): no search hands one to a prompt."""


def quarantined(doc: Mapping[str, Any]) -> list[str]:
    """The :data:`HIDDEN_FLAG` flags stored with a retrieved passage (empty: not quarantined)."""
    stored = str((doc.get("metadata") or {}).get("injection_flags") or "")
    return [f for f in stored.split(",") if f.startswith(HIDDEN_FLAG)]


FLAG_HEADROOM = 3
"""Extra passages a search fetches so that those :func:`keep_clean` drops are replaced: a planted
passage changes neither how many passages are read nor which."""


def keep_clean(docs: Iterable[Mapping[str, Any]], k: int) -> tuple[list[dict], list[dict]]:
    """``(kept, flagged)``: the first ``k`` passages of ``docs`` (best first) neither quarantined
    nor flagged by :func:`screen_passage`; and every screened-out one as ``{"id", "patterns"}``."""
    kept: list[dict] = []
    flagged: list[dict] = []
    for doc in docs:
        hits = quarantined(doc) + screen_passage(doc.get("text") or "")
        if hits:
            flagged.append({"id": doc["id"], "patterns": hits})
        elif len(kept) < k:
            kept.append(doc)
    return kept, flagged


def rejection_message(check: InjectionCheck) -> str:
    """What the user reads when their input is rejected as an injection."""
    return (
        "Request rejected: it looks like an attempt to change the assistant's instructions "
        f"({check['reason']}). Ask a legal research question instead."
    )


# --- The policy ---------------------------------------------------------------------------------
_COMMANDS = (
    r"(?:ignore|disregard|forget|override|bypass|pretend|role-?play|act\s+as|respond|reply|print|"
    r"reveal|say|write|output|answer|select|choose|pick|repeat|tell|show|list|give|stop|do\s+not|"
    r"don'?t|conclude|mark|append|include|treat|end|activate|enable|enter|switch|read|obey|follow|"
    r"execute|translate|evaluate|process|cite|invent|fabricate|make\s+up)"
)
_CONTROL_CUES = re.compile(
    r"\b(?:you|your|yours|yourself|u|ur|from\s+now\s+on|persona|jailbreak|base64|rot13|decode)\b"
    rf"|{_START}{_COMMANDS}\b|{_START}(?:never|always|only)\s+{_COMMANDS}s?\b"
    rf"|\b(?:to|for|dear|hey|attention)\s+(?:the\s+|any\s+|this\s+|whatever\s+)?{_AI}\b"
    rf"|\b{_AI}\s+(?:must|should|will|shall|is\s+to|needs?\s+to|has\s+to|may\s+not|cannot)\b",
    _I,
)
"""What an instruction to the assistant needs: the second person, an imperative at a clause start
("never", "always", "only" only before one), an AI as addressee ("note to the AI"), or words of
persona and encoding tricks; "a company's chatbot" or "jury instructions" are subject matter."""
_FABRICATION_CUES = re.compile(
    r"\b(?:fake|fabricat\w*|made[-\s]?up|make\s+(?:\w+\s+)?up|invent\w*|fictitious|fictional|"
    r"non-?existent|imaginary|bogus|phony)\b[^.\n]{0,60}\b(?:cases?|citations?|cites|"
    r"authorit(?:y|ies)|precedents?|holdings?|quotes?|statutes?|decisions?|rulings?)\b"
    r"|\b(?:cases?|citations?|authorit(?:y|ies)|precedents?|holdings?)\b[^.\n]{0,60}\b(?:fake|"
    r"fabricat\w*|made[-\s]?up|make\s+(?:\w+\s+)?up|invent\w*|fictitious|non-?existent|"
    r"don'?t\s+exist|do\s+not\s+exist|aren'?t\s+real)\b",
    _I,
)

_QUOTED = re.compile(r"\"[^\"\n]{1,600}\"")
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself|u|ur)\b", _I)
_U_ABBREVIATION = re.compile(r"\b(?:u|ur)\b(?=\s*\.)", _I)
"""A quoted span (a character's words in a fact pattern; :func:`normalize` straightens curly
quotes), the second person, and "U." as in "U.S.C." or "D.U.I." (not the text-speak "u")."""


def addresses_the_assistant(text: str) -> bool:
    """True when ``text`` could hold an instruction to the assistant: words a command would use
    (not the second person inside quotes, nor "U."), an encoded payload, or a request involving
    fabricated authorities.  An LLM 'injection' verdict on any other text is overruled: the small
    local model flags plain fact patterns (docs/MEASUREMENTS_HISTORY.md, "Injection check")."""
    norm = normalize(text)
    quoted_to_third_person = _QUOTED.sub(lambda q: _SECOND_PERSON.sub("they", q.group(0)), norm)
    cues = _U_ABBREVIATION.sub("x", quoted_to_third_person)
    return bool(
        _CONTROL_CUES.search(cues)
        or _FABRICATION_CUES.search(norm)
        or decoded_payloads(norm)
        or any(_looks_encoded(m.group(0)) for m in _BASE64.finditer(norm))
        or _HEX_RUN.search(norm)
    )


def _looks_encoded(token: str) -> bool:
    """A long token mixing digits, lower and upper case letters (a base64 blob, not a word)."""
    return all(any(map(kind, token)) for kind in (str.isdigit, str.islower, str.isupper))


def detect(text: str, client: Any, *, skip_llm: bool) -> InjectionCheck:
    """The injection check of one user input (``client``: an ``llm_config.LLMClient``): a
    pre-screen hit rejects with no LLM call; with no verdict of the model (``skip_llm``, a failed
    call, an unparsed reply) the pre-screen alone decides; else the model's verdict, but an
    'injection' verdict on text that never addresses the assistant is overruled."""
    if hits := screen_user_input(text):
        return _check(False, "not_needed", f"pre-screen: {', '.join(hits)}", hits)
    if skip_llm:
        return _check(True, "skipped", "LLM check skipped; pre-screen clean")
    try:
        result = prompts.call(client, "injection", user_input=prompts.quote("user_input", text))
    except LLMCallError as exc:
        logger.warning("injection check: the LLM call failed; passing on the pre-screen: %s", exc)
        return _check(True, "error", f"LLM call failed; pre-screen clean ({exc})"[:200])
    if (parsed := result.parsed) is None:
        return _check(True, "unparsed", "LLM verdict unparsed; pre-screen clean")
    if parsed.verdict == "injection" and not addresses_the_assistant(text):
        reason = f"LLM verdict overruled: no instruction to the assistant ({parsed.reason})"
        return _check(True, "injection", reason)
    return _check(parsed.verdict == "safe", parsed.verdict, parsed.reason)


def _check(
    is_safe: bool, llm_verdict: LLMVerdict, reason: str, prescreen: Iterable[str] = ()
) -> InjectionCheck:
    prescreen_only = llm_verdict in ("skipped", "error", "unparsed")
    return InjectionCheck(
        is_safe=is_safe,
        verdict="safe" if is_safe else "injection",
        prescreen=list(prescreen),
        llm_verdict=llm_verdict,
        reason=reason,
        injection_check="prescreen_only" if prescreen_only else "full",
    )
