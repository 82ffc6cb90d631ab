"""Seeds for self-generated documents (``selfgen.py``): the few tokens a document starts from before the target writes
the rest at temperature 0.7-1.0.

A seed only points the target somewhere; everything after it is the target's own text, so the data covers what the
target says rather than what one corpus holds. Families, each with the kind its rows are counted under
(``generate.KINDS``):
- ``bos``: BOS alone (prose): whatever the target writes unprompted;
- ``topic``: a topic word, bare or as a title (prose);
- ``question``: a question opener, as a user might start a search or a forum post (prose);
- ``chat``: a Gemma user turn, empty or started with a request opener (chat); the target writes the request, and
  with ``ignore_eos`` it goes on through its own answer and often into further turns (multi-turn);
- ``chat_answer``: a whole user turn of a topic and a request, the model turn opened (chat); from document
  FOLLOWUPS_FROM on, three in four also send one or two follow-up user turns (``followups``), each after the
  target's answer to the last (multi-turn: the drafter sees the turn structure of a conversation);
- ``code``: a file header in one of many languages (code);
- ``list``: the start of a list, table or numbered record (repetition).
"""

from __future__ import annotations

import random

KIND_OF = {"bos": "prose", "topic": "prose", "question": "prose", "chat": "chat", "chat_answer": "chat",
           "code": "code", "list": "repetition"}
# chat and code weigh most: the evaluation kinds where the shipped drafter is weakest on unseen prompts
WEIGHTS = {"bos": 0.06, "topic": 0.14, "question": 0.12, "chat": 0.2, "chat_answer": 0.12, "code": 0.26, "list": 0.1}
# The first document that may have follow-up turns, counted in each process's range of a million (remote.sh
# selfgen's SPAN): the runs of 2026-12-05 and -06 (documents below it in every range) had none, and every
# document's plan before it stays what it was when they ran
FOLLOWUPS_FROM = 3340
FOLLOWUP_SHARE = 0.75  # of the chat_answer documents from there on

TOPICS = """astronomy volcanoes photosynthesis gardening mortgages knitting jazz chess cryptography bees glaciers
vaccines taxes bridges rainforests submarines origami inflation democracy typography coffee tea bread cheese wine
football tennis cycling swimming marathons sleep nutrition anxiety friendship parenting retirement insurance
electricity magnets batteries semiconductors lasers satellites rockets telescopes dinosaurs fossils whales sharks
owls wolves ants mushrooms soil compost recycling plastics oceans tides hurricanes earthquakes deserts rivers lakes
mountains islands castles pyramids empires revolutions elections courts contracts patents startups marketing
accounting logistics shipping railways aviation cars tyres engines bicycles architecture furniture painting
sculpture photography cinema theatre poetry novels grammar translation linguistics mathematics probability
statistics geometry algebra calculus physics chemistry biology genetics evolution neuroscience psychology sociology
economics philosophy ethics religion mythology folklore festivals weddings funerals holidays travel hotels camping
hiking climbing fishing hunting cooking baking barbecue spices chocolate sugar salt water energy solar wind nuclear
climate pollution forests farming cattle horses dogs cats birds insects robots databases compilers networks
browsers passwords privacy spreadsheets email smartphones keyboards printers""".split()

QUESTION_OPENERS = ["How do I", "How can I", "What is the best way to", "Why does", "Why do", "What happens if",
                    "Is it safe to", "Can you", "What are the differences between", "How long does it take to",
                    "Should I", "Where can I find", "When did", "Who invented", "What is", "How many",
                    "Is there a way to", "Does anyone know", "What should I do if", "How does"]

REQUEST_OPENERS = ["", "", "", "Write", "Explain", "Can you", "Help me", "Give me", "What", "How", "I need",
                   "Summarize", "Translate", "Tell me", "Create", "List", "Why", "Please", "Hi", "Fix"]
REQUESTS = ["Explain {t} to a beginner.", "Write a short paragraph about {t}.", "Give me three facts about {t}.",
            "What are the most common mistakes people make with {t}?", "Write a poem about {t}.",
            "Make a table comparing two kinds of {t}.", "Summarize the history of {t} in a few sentences.",
            "I want to learn about {t}. Where should I start?", "Write a Python script related to {t}.",
            "List the pros and cons of {t}."]

CODE_HEADERS = {
    "python": ["#!/usr/bin/env python3\n", "import os\nimport sys\n", "from __future__ import annotations\n\n",
               "import numpy as np\n", "class ", "def ", "\"\"\""],
    "javascript": ["'use strict';\n\n", "const ", "import React from 'react';\n", "function ", "module.exports = "],
    "typescript": ["import { ", "export interface ", "export const ", "type "],
    "java": ["package com.", "import java.util.", "public class ", "@Override\n"],
    "c": ["#include <stdio.h>\n", "#include <stdlib.h>\n#include <string.h>\n\n", "/*\n * ",
          "int main(int argc, char **argv)\n{\n"],
    "cpp": ["#include <iostream>\n", "#include <vector>\n#include <string>\n\n", "namespace ",
            "template <typename T>\n"],
    "csharp": ["using System;\n", "namespace ", "public class "],
    "go": ["package main\n\nimport (\n", "package ", "func "],
    "rust": ["use std::", "fn main() {\n", "#[derive(", "pub struct ", "impl "],
    "ruby": ["require '", "class ", "def ", "module "],
    "php": ["<?php\n\n", "<?php\nnamespace App\\"],
    "swift": ["import Foundation\n\n", "import SwiftUI\n\nstruct "],
    "kotlin": ["package ", "fun main() {\n", "data class "],
    "scala": ["object ", "case class "],
    "sql": ["SELECT ", "CREATE TABLE ", "-- ", "INSERT INTO "],
    "bash": ["#!/bin/bash\n", "#!/usr/bin/env bash\nset -euo pipefail\n\n"],
    "html": ["<!DOCTYPE html>\n<html>\n<head>\n", "<div class=\""],
    "css": [".container {\n", "body {\n  margin: 0;\n"],
    "yaml": ["version: '3'\nservices:\n", "apiVersion: apps/v1\nkind: ", "name: CI\n\non:\n"],
    "json": ["{\n  \"name\": \"", "[\n  {\n    \"id\": "],
    "markdown": ["# ", "## Installation\n\n", "README\n\n"],
    "lua": ["local ", "function "],
    "r": ["library(", "# Load the data\n"],
    "haskell": ["module ", "import qualified Data.Map as Map\n\n"],
    "dockerfile": ["FROM ", "FROM python:3.12-slim\n\nWORKDIR /app\n"],
    "makefile": ["CC = gcc\nCFLAGS = ", ".PHONY: all clean\n\n"],
    "latex": ["\\documentclass{article}\n", "\\begin{"],
}

# what users send after an answer: about it, or on to something near it
FOLLOWUPS = ["Can you give an example?", "Make it shorter.", "Why is that?", "Can you explain that more simply?",
             "Thanks! What about {t}?", "Can you put that in a table?", "Write it as a list.",
             "What are the downsides?", "Tell me more.", "Is that always true?", "How does that relate to {t}?",
             "Now write the same for {t}.", "Can you add code for that?", "ok", "That's wrong, try again.",
             "Summarize what you said in one sentence."]
LIST_OPENERS = ["1. ", "- ", "* ", "| Name | ", "Step 1: ", "Monday: ", "id,name,", "Q1: ", "[1] ", "a) ",
                "Day 1\n", "Chapter 1\n", "2024-01-01 ", "TODO:\n- [ ] ", "Item\tPrice\tQty\n", "{\"id\": 1, "]


def seed(rng: random.Random) -> tuple[str, str]:
    """(family, seed text): the text is what follows BOS; chat families hold Gemma's turn markup, to be parsed as
    special tokens."""
    family = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    topic = rng.choice(TOPICS)
    if family == "bos":
        text = ""
    elif family == "topic":
        text = rng.choice([topic.capitalize(), f"# {topic.capitalize()}\n\n", f"{topic.capitalize()}\n\n",
                           f"Topic: {topic}\n", f"The {topic}"])
    elif family == "question":
        text = rng.choice(QUESTION_OPENERS)
    elif family == "chat":
        text = "<start_of_turn>user\n" + rng.choice(REQUEST_OPENERS)
    elif family == "chat_answer":
        text = f"<start_of_turn>user\n{rng.choice(REQUESTS).format(t=topic)}<end_of_turn>\n<start_of_turn>model\n"
    elif family == "code":
        text = rng.choice(CODE_HEADERS[rng.choice(list(CODE_HEADERS))])
    else:
        text = rng.choice(LIST_OPENERS)
    return family, text


def followups(rng: random.Random, family: str, index: int) -> list[str]:
    """The user turns document ``index`` sends after the target's answers, in Gemma's turn markup (each closes the
    model turn before it and opens the next): one or two for most ``chat_answer`` documents from FOLLOWUPS_FROM on,
    else none. Drawn after the rest of the document's plan, which therefore stays what it was before."""
    if family != "chat_answer" or index % 1_000_000 < FOLLOWUPS_FROM or rng.random() >= FOLLOWUP_SHARE:
        return []
    return [f"<end_of_turn>\n<start_of_turn>user\n{rng.choice(FOLLOWUPS).format(t=rng.choice(TOPICS))}<end_of_turn>\n"
            f"<start_of_turn>model\n" for _ in range(rng.choice([1, 2]))]
