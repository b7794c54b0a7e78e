"""Reading a hand-in back as a student's marker would: its headings, and its tables as rows of cells."""

from __future__ import annotations

import re

# The course template's own words (microsoft/AI-System, Labs/BasicLabs/Lab1), verbatim.
TEMPLATE_HEADINGS = ("实验环境", "实验结果", "1. 模型可视化结果截图", "2. 网络分析，不同批大小结果比较")
TEMPLATE_LABELS = (
    "硬件环境",
    "CPU（vCPU数目）",
    "GPU(型号，数目)",
    "软件环境",
    "OS版本",
    "深度学习框架<br>python包名称及版本",
    "CUDA版本",
    "神经网络数据流图",
    "损失和正确率趋势图",
    "网络分析，使用率前十名的操作",
    "批大小",
    "结果比较",
)
UNFILLED = re.compile(r"TODO|TBD|\{[a-z_]+(:[^}]*)?\}|&nbsp;", re.IGNORECASE)


def headings(markdown: str) -> list[str]:
    return [line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("#")]


def tables(markdown: str) -> list[list[list[str]]]:
    """Every table's body rows (header and rule left out), each a list of its cells' text."""
    found: list[list[list[str]]] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        if lines[index].startswith("|") and index + 1 < len(lines) and set(lines[index + 1]) <= set("|-: "):
            body = []
            index += 2
            while index < len(lines) and lines[index].startswith("|"):
                body.append([cell.strip() for cell in lines[index].strip().strip("|").split(" | ")])
                index += 1
            found.append(body)
        else:
            index += 1
    return found


def header(markdown: str, index: int) -> list[str]:
    """The header row's cells of the markdown's `index`-th table (counted as `tables` counts them)."""
    lines = markdown.splitlines()
    found = [
        i
        for i in range(len(lines) - 1)
        if lines[i].startswith("|") and set(lines[i + 1]) <= set("|-: ") and "-" in lines[i + 1]
    ]
    return [cell.strip() for cell in lines[found[index]].strip().strip("|").split(" | ")]


def numbers(markdown: str) -> list[str]:
    """The decimal numbers a text states, in order (what two languages of one hand-in must share)."""
    return re.findall(r"\d[\d,]*\.\d+", markdown)
