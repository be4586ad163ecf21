"""Call-based built-in Code-v0 problems (written for llm-zoo): the solver defines a function, or
LeetCode's ``class Solution`` with a method; tests call it with arguments and compare the return
value. Expected values come from running ``reference`` through the call harness in the sandbox
(``tools/build_code_problems.py``). Each statement's example is test 0."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from code_problems.common import rng


@dataclass(frozen=True)
class CallProblem:
    """One call-based problem as written.

    Attributes:
        slug: Short unique name; the problem id is ``builtin/<slug>``.
        title: Display title.
        difficulty: ``easy`` / ``medium`` / ``hard``.
        statement: The task, constraints and an example line ``Example: <call> returns <value>``.
        name: The function (or method) to call.
        class_name: ``"Solution"`` for a LeetCode-style method, ``None`` for a function.
        signature: The code skeleton shown to the agents.
        reference: A correct, efficient solution defining the function / class.
        args: Argument lists of the hidden tests (at least 5; the example first).
    """

    slug: str
    title: str
    difficulty: str
    statement: str
    name: str
    class_name: str | None
    signature: str
    reference: str
    args: tuple[list, ...]


def call_problem(slug, title, difficulty, statement, name, class_name, signature, reference, args):
    return CallProblem(
        slug,
        title,
        difficulty,
        textwrap.dedent(statement).strip() + "\n",
        name,
        class_name,
        textwrap.dedent(signature).strip(),
        textwrap.dedent(reference).strip() + "\n",
        tuple(args),
    )


_r = rng(707)


def _ints(n, low, high):
    return [_r.randint(low, high) for _ in range(n)]


def _word(n, letters="abc"):
    return "".join(_r.choice(letters) for _ in range(n))


def _grid(rows, cols, wall):
    cells = [["#" if _r.random() < wall else "." for _ in range(cols)] for _ in range(rows)]
    cells[0][0] = cells[-1][-1] = "."
    return ["".join(row) for row in cells]


PROBLEMS = [
    call_problem(
        "count-runs", "Count the Runs", "easy",
        """
        A run is a maximal block of equal adjacent characters: "aabccc" has the runs "aa", "b", "ccc".
        Return the number of runs in the string s (0 for the empty string).

        Constraints: 0 <= len(s) <= 10^5, s consists of lowercase letters.

        Example: count_runs('aabccc') returns 3
        """,
        "count_runs", None, "def count_runs(s: str) -> int:",
        """
        def count_runs(s: str) -> int:
            return sum(1 for i, ch in enumerate(s) if i == 0 or s[i - 1] != ch)
        """,
        [["aabccc"], [""], ["a"], ["abab"], ["zzzz"], [_word(3000, "ab")]],
    ),
    call_problem(
        "rotate-left", "Rotate Left", "easy",
        """
        Return the list nums rotated left by k positions: the first k elements move to the end, in order.
        k may exceed the length (rotating by the length gives the list back); an empty list stays empty.

        Constraints: 0 <= len(nums) <= 10^4, 0 <= k <= 10^9.

        Example: Solution().rotateLeft([1, 2, 3, 4, 5], 2) returns [3, 4, 5, 1, 2]
        """,
        "rotateLeft", "Solution",
        """
        class Solution:
            def rotateLeft(self, nums: List[int], k: int) -> List[int]:
        """,
        """
        from typing import List


        class Solution:
            def rotateLeft(self, nums: List[int], k: int) -> List[int]:
                if not nums:
                    return []
                k %= len(nums)
                return nums[k:] + nums[:k]
        """,
        [[[1, 2, 3, 4, 5], 2], [[], 3], [[7], 1000000000], [[1, 2, 3], 3], [[1, 2, 3], 4], [_ints(500, -99, 99), 12345]],
    ),
    call_problem(
        "second-largest-distinct", "Second Largest Distinct Value", "easy",
        """
        Return the second-largest distinct value in values, or None if values has fewer than two
        distinct values.

        Constraints: 0 <= len(values) <= 10^5, -10^9 <= values[i] <= 10^9.

        Example: second_largest([4, 1, 4, 3]) returns 3
        """,
        "second_largest", None, "def second_largest(values: List[int]) -> Optional[int]:",
        """
        from typing import List, Optional


        def second_largest(values: List[int]) -> Optional[int]:
            distinct = sorted(set(values))
            return distinct[-2] if len(distinct) >= 2 else None
        """,
        [[[4, 1, 4, 3]], [[]], [[5, 5, 5]], [[-1, -2]], [[10**9, -(10**9)]], [_ints(4000, -(10**9), 10**9)]],
    ),
    call_problem(
        "bracket-check", "Balanced Brackets", "easy",
        """
        Return True if the brackets (), [] and {} in s are balanced (every opening bracket is closed by
        the matching bracket, properly nested), else False. Other characters are ignored.

        Constraints: 0 <= len(s) <= 10^5.

        Example: Solution().isBalanced('a(b[c]{d})') returns True
        """,
        "isBalanced", "Solution",
        """
        class Solution:
            def isBalanced(self, s: str) -> bool:
        """,
        """
        class Solution:
            def isBalanced(self, s: str) -> bool:
                pairs = {")": "(", "]": "[", "}": "{"}
                stack = []
                for ch in s:
                    if ch in "([{":
                        stack.append(ch)
                    elif ch in pairs:
                        if not stack or stack.pop() != pairs[ch]:
                            return False
                return not stack
        """,
        [["a(b[c]{d})"], [""], ["(]"], ["(("], ["x)y("], ["([]{[]})" * 500], ["[" * 1000 + "]" * 999]],
    ),
    call_problem(
        "digit-root", "Digital Root", "easy",
        """
        Replace the non-negative integer n by the sum of its decimal digits until it has one digit, and
        return that digit.

        Constraints: 0 <= n <= 10^100.

        Example: digit_root(9875) returns 2
        """,
        "digit_root", None, "def digit_root(n: int) -> int:",
        """
        def digit_root(n: int) -> int:
            while n >= 10:
                n = sum(int(d) for d in str(n))
            return n
        """,
        [[9875], [0], [9], [10], [10**100], [123456789123456789]],
    ),
    call_problem(
        "longest-unique-window", "Longest Window Without Repeats", "medium",
        """
        Return the length of the longest substring of s (contiguous) in which no character repeats.

        Constraints: 0 <= len(s) <= 10^5.

        Example: Solution().longestUniqueWindow('abcabcbb') returns 3
        """,
        "longestUniqueWindow", "Solution",
        """
        class Solution:
            def longestUniqueWindow(self, s: str) -> int:
        """,
        """
        class Solution:
            def longestUniqueWindow(self, s: str) -> int:
                last, start, best = {}, 0, 0
                for i, ch in enumerate(s):
                    if last.get(ch, -1) >= start:
                        start = last[ch] + 1
                    last[ch] = i
                    best = max(best, i - start + 1)
                return best
        """,
        [["abcabcbb"], [""], ["bbbb"], ["pwwkew"], ["abcdefghij"], [_word(20000, "abcdefghijklmnop")]],
    ),
    call_problem(
        "merge-intervals", "Merge Intervals", "medium",
        """
        intervals is a list of [start, end] pairs (start <= end). Merge every group of overlapping or
        touching intervals ([1, 3] and [3, 5] touch) and return the merged intervals sorted by start.

        Constraints: 0 <= len(intervals) <= 10^4, -10^9 <= start <= end <= 10^9.

        Example: merge_intervals([[5, 6], [1, 3], [2, 4]]) returns [[1, 4], [5, 6]]
        """,
        "merge_intervals", None, "def merge_intervals(intervals: List[List[int]]) -> List[List[int]]:",
        """
        from typing import List


        def merge_intervals(intervals: List[List[int]]) -> List[List[int]]:
            merged = []
            for start, end in sorted(intervals):
                if merged and start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            return merged
        """,
        [
            [[[5, 6], [1, 3], [2, 4]]], [[]], [[[1, 3], [3, 5]]], [[[1, 10], [2, 3], [4, 5]]],
            [[[-5, -1], [0, 0], [1, 2]]],
            [[sorted(pair) for pair in zip(_ints(2000, -10**6, 10**6), _ints(2000, -10**6, 10**6), strict=True)]],
        ],
    ),
    call_problem(
        "min-coins", "Fewest Coins", "medium",
        """
        Return the fewest coins (each value in coins can be used any number of times) that add up to
        amount, or -1 if no combination does. The amount 0 needs 0 coins.

        Constraints: 1 <= len(coins) <= 12, 1 <= coins[i] <= 10^4, 0 <= amount <= 10^4.

        Example: Solution().minCoins([1, 2, 5], 11) returns 3
        """,
        "minCoins", "Solution",
        """
        class Solution:
            def minCoins(self, coins: List[int], amount: int) -> int:
        """,
        """
        from typing import List


        class Solution:
            def minCoins(self, coins: List[int], amount: int) -> int:
                best = [0] + [amount + 1] * amount
                for value in range(1, amount + 1):
                    for coin in coins:
                        if coin <= value and best[value - coin] + 1 < best[value]:
                            best[value] = best[value - coin] + 1
                return best[amount] if best[amount] <= amount else -1
        """,
        [[[1, 2, 5], 11], [[2], 3], [[7], 0], [[3, 7], 12], [[186, 419, 83, 408], 6249], [[9, 6, 5, 1], 9999]],
    ),
    call_problem(
        "anagram-group-sizes", "Anagram Group Sizes", "medium",
        """
        Group the words that are anagrams of each other (same letters, same counts). Return the sizes
        of the groups, largest first.

        Constraints: 0 <= len(words) <= 10^4, each word has 1 to 20 lowercase letters.

        Example: anagram_group_sizes(['eat', 'tea', 'tan', 'ate', 'nat', 'bat']) returns [3, 2, 1]
        """,
        "anagram_group_sizes", None, "def anagram_group_sizes(words: List[str]) -> List[int]:",
        """
        from collections import Counter
        from typing import List


        def anagram_group_sizes(words: List[str]) -> List[int]:
            groups = Counter("".join(sorted(word)) for word in words)
            return sorted(groups.values(), reverse=True)
        """,
        [
            [["eat", "tea", "tan", "ate", "nat", "bat"]], [[]], [["a"]], [["ab", "ba", "ab"]],
            [["abc", "def", "ghi"]], [[_word(_r.randint(1, 4)) for _ in range(3000)]],
        ],
    ),
    call_problem(
        "mean-and-deviation", "Mean and Deviation", "medium",
        """
        Return [mean, deviation] of the numbers in values: the mean, and the population standard
        deviation sqrt(sum((x - mean)^2) / n). Answers within 1e-6 (absolute or relative) are accepted.

        Constraints: 1 <= len(values) <= 10^5, -10^6 <= values[i] <= 10^6.

        Example: mean_and_deviation([2, 4, 4, 4, 5, 5, 7, 9]) returns [5.0, 2.0]
        """,
        "mean_and_deviation", None, "def mean_and_deviation(values: List[float]) -> List[float]:",
        """
        import math
        from typing import List


        def mean_and_deviation(values: List[float]) -> List[float]:
            mean = math.fsum(values) / len(values)
            return [mean, math.sqrt(math.fsum((x - mean) ** 2 for x in values) / len(values))]
        """,
        [
            [[2, 4, 4, 4, 5, 5, 7, 9]], [[3]], [[1.5, 2.5]], [[-1000000, 1000000]], [[0.1, 0.2, 0.3]],
            [[_r.uniform(-1000, 1000) for _ in range(1000)]],
        ],
    ),
    call_problem(
        "count-inversions", "Count Inversions", "hard",
        """
        Return the number of pairs (i, j) with i < j and nums[i] > nums[j]. An O(n^2) solution is too
        slow for the largest inputs.

        Constraints: 0 <= len(nums) <= 10^5, -10^9 <= nums[i] <= 10^9.

        Example: Solution().countInversions([3, 1, 2]) returns 2
        """,
        "countInversions", "Solution",
        """
        class Solution:
            def countInversions(self, nums: List[int]) -> int:
        """,
        """
        from typing import List


        class Solution:
            def countInversions(self, nums: List[int]) -> int:
                def sort(items):
                    if len(items) <= 1:
                        return items, 0
                    middle = len(items) // 2
                    left, a = sort(items[:middle])
                    right, b = sort(items[middle:])
                    merged, count, i, j = [], a + b, 0, 0
                    while i < len(left) and j < len(right):
                        if right[j] < left[i]:
                            merged.append(right[j])
                            count += len(left) - i
                            j += 1
                        else:
                            merged.append(left[i])
                            i += 1
                    return merged + left[i:] + right[j:], count

                return sort(list(nums))[1]
        """,
        [[[3, 1, 2]], [[]], [[1, 2, 3]], [[3, 2, 1]], [[2, 2, 1, 1]], [_ints(8000, -(10**9), 10**9)]],
    ),
    call_problem(
        "grid-shortest-path", "Shortest Path in a Grid", "hard",
        """
        grid is a list of equal-length strings of '.' (free) and '#' (wall). Moving up, down, left or
        right between free cells, return the fewest moves from the top-left cell to the bottom-right
        cell, or -1 if it cannot be reached. Both corners are free.

        Constraints: 1 <= rows, columns <= 200.

        Example: shortest_grid_path(['..#', '#..', '#..']) returns 4
        """,
        "shortest_grid_path", None, "def shortest_grid_path(grid: List[str]) -> int:",
        """
        from collections import deque
        from typing import List


        def shortest_grid_path(grid: List[str]) -> int:
            rows, cols = len(grid), len(grid[0])
            dist = {(0, 0): 0}
            queue = deque([(0, 0)])
            while queue:
                r, c = queue.popleft()
                if (r, c) == (rows - 1, cols - 1):
                    return dist[(r, c)]
                for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                    if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] == "." and (nr, nc) not in dist:
                        dist[(nr, nc)] = dist[(r, c)] + 1
                        queue.append((nr, nc))
            return -1
        """,
        [
            [["..#", "#..", "#.."]], [["."]], [[".#", "#."]], [["....", "###.", "....", ".###", "...."]],
            [_grid(60, 60, 0.25)], [_grid(200, 200, 0.2)],
        ],
    ),
    call_problem(
        "edit-steps", "Edit Steps", "hard",
        """
        Return the fewest single-character insertions, deletions and substitutions that turn a into b.

        Constraints: 0 <= len(a), len(b) <= 1000.

        Example: Solution().editDistance('kitten', 'sitting') returns 3
        """,
        "editDistance", "Solution",
        """
        class Solution:
            def editDistance(self, a: str, b: str) -> int:
        """,
        """
        class Solution:
            def editDistance(self, a: str, b: str) -> int:
                previous = list(range(len(b) + 1))
                for i, x in enumerate(a, start=1):
                    current = [i]
                    for j, y in enumerate(b, start=1):
                        current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
                    previous = current
                return previous[-1]
        """,
        [["kitten", "sitting"], ["", "abc"], ["abc", ""], ["same", "same"], ["ab", "ba"], [_word(600), _word(500)]],
    ),
    call_problem(
        "increasing-subsequence-length", "Increasing Subsequence Length", "hard",
        """
        Return the length of the longest strictly increasing subsequence of nums (not necessarily
        contiguous). An O(n^2) solution is too slow for the largest inputs.

        Constraints: 0 <= len(nums) <= 10^5, -10^9 <= nums[i] <= 10^9.

        Example: longest_increasing([10, 9, 2, 5, 3, 7, 101, 18]) returns 4
        """,
        "longest_increasing", None, "def longest_increasing(nums: List[int]) -> int:",
        """
        from bisect import bisect_left
        from typing import List


        def longest_increasing(nums: List[int]) -> int:
            tails = []
            for x in nums:
                i = bisect_left(tails, x)
                if i == len(tails):
                    tails.append(x)
                else:
                    tails[i] = x
            return len(tails)
        """,
        [[[10, 9, 2, 5, 3, 7, 101, 18]], [[]], [[5, 5, 5]], [[1, 2, 3, 4]], [[4, 3, 2, 1]], [_ints(8000, -(10**9), 10**9)]],
    ),
]  # fmt: skip
